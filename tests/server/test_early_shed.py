"""An OpenAI request to a full engine is refused from its head (`server.early_shed`): the 429
the full path gives (Retry-After, the error naming the bound, X-Request-Id), logged and
counted, its body never read (a body that is not even JSON gets the 429), the connection kept
for the next request; what the head alone cannot decide (a key that does not pass, a bad
X-Request-Timeout, a body over the limit) takes the full path. A model serving LoRA adapters:
each refusal counted for the model or adapter its body names. Each followed by a good
request once the engine has room. A real uvicorn server: the early answer is its protocol's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx
import pytest
import uvicorn

from podium.backends.base import Backend
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from podium.server.serve import uvicorn_config
from tests.support.fake_backends import FakeLlmBackend, add_ready
from tests.support.full_engine import FullEngine
from tests.support.polling import async_eventually
from tests.support.ports import free_port

CHAT = "/v1/chat/completions"
GOOD = {"model": "fake-llm", "messages": [{"role": "user", "content": "hello there"}]}
KEY = "k-early"


def _refusals_counted(model: str = "fake-llm") -> float:
    """podium:requests of 429s on the chat route (this process's registry)."""
    from podium.metrics.server import REQUESTS

    return REQUESTS.labels(model, "1", "openai", CHAT, "429")._value.get()


ADAPTER = "fake-adapter"


class AdaptedLlm(FakeLlmBackend):
    """A fake LLM serving one LoRA adapter (`ADAPTER`, version 1) on its engine."""

    def adapter(self, name: str, version: str | None) -> Backend | None:
        if name != ADAPTER or version not in (None, "1"):
            return None
        view = FakeLlmBackend(ADAPTER, "1")
        view.engine = self.engine
        return view


@contextlib.asynccontextmanager
async def served(adapters: bool = False, **config: object
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, FullEngine]]:
    port = free_port()
    settings = ServerConfig(host="127.0.0.1", http_port=port, grpc_port=-1, **config)
    instance = Instance(settings)
    backend = AdaptedLlm() if adapters else FakeLlmBackend()
    backend.engine = engine = FullEngine()
    backend.serves_adapters = adapters
    add_ready(instance.repository, backend)
    instance.booted = True
    server = uvicorn.Server(uvicorn_config(build_app(instance), settings, instance=instance))
    task = asyncio.create_task(server.serve())
    try:
        assert await async_eventually(lambda: server.started, 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     headers={"authorization": f"Bearer {KEY}"}) as client:
            yield client, engine
    finally:
        server.should_exit = True
        await task


async def test_a_full_engine_refuses_from_the_head(capsys: pytest.CaptureFixture[str]) -> None:
    async with served(api_key=KEY) as (client, engine):
        before = _refusals_counted()
        # not even JSON: answered from the head, its body never parsed
        r = await client.post(CHAT, content=b"{not json", headers={"x-request-id": "early-1"})
        assert _refusals_counted() == before + 1
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1" and r.headers["x-request-id"] == "early-1"
        error = r.json()["error"]
        assert error["type"] == "rate_limit_error" and error["param"] == "max_num_queued_reqs"
        assert "early-1 POST /v1/chat/completions 429" in capsys.readouterr().err
        # on the same connection, what the head cannot decide takes the full path
        r = await client.post(CHAT, json=GOOD, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401, r.text
        r = await client.post(CHAT, json=GOOD, headers={"X-Request-Timeout": "nan"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Timeout"
        checks = engine.checks
        r = await client.post(CHAT, json={**GOOD, "messages": [
            {"role": "user", "content": "x" * 2000}]})
        assert r.status_code == 429  # the full path's own check refuses it
        engine.full = False
        r = await client.post(CHAT, json=GOOD)
        assert r.status_code == 200, r.text
        assert engine.checks > checks


async def test_a_body_over_the_limit_is_413_not_429() -> None:
    async with served(max_body_bytes=1024) as (client, engine):
        r = await client.post(CHAT, content=json.dumps({**GOOD, "pad": "x" * 2000}))
        assert r.status_code == 413, r.text
        engine.full = False
        assert (await client.post(CHAT, json=GOOD)).status_code == 200


async def test_a_stream_request_gets_the_same_refusal() -> None:
    async with served() as (client, engine):
        r = await client.post(CHAT, json={**GOOD, "stream": True})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "max_num_queued_reqs" in r.json()["error"]["message"]
        engine.full = False
        ok = await client.post(CHAT, json=GOOD)
        assert ok.status_code == 200 and ok.json()["choices"], SimpleNamespace(r=ok.text)


async def test_a_model_serving_adapters_counts_each_refusal_for_the_model_its_body_names(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The body may name an adapter, whose refusal is counted for the adapter (as the full
    path counts it): the refusal is still answered from the head, and the body, kept as it
    arrives, names the model of its log line and count. A body naming the base, or nothing
    JSON, is counted for the base; never the adapter's for the base."""
    async with served(adapters=True) as (client, engine):
        base_before = _refusals_counted()
        adapter_before = _refusals_counted(ADAPTER)
        r = await client.post(CHAT, json={**GOOD, "model": ADAPTER},
                              headers={"x-request-id": "early-a"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert _refusals_counted(ADAPTER) == adapter_before + 1
        assert _refusals_counted() == base_before
        line = next(line for line in capsys.readouterr().err.splitlines()
                    if f"early-a POST {CHAT} 429" in line)
        assert f" openai {ADAPTER}@1 " in line, line  # the request log names the adapter
        r = await client.post(CHAT, json={**GOOD, "model": f"{ADAPTER}@1"})
        assert r.status_code == 429 and _refusals_counted(ADAPTER) == adapter_before + 2
        r = await client.post(CHAT, content=b"{not json")  # the head's 429, for the base
        assert r.status_code == 429 and _refusals_counted() == base_before + 1
        assert (await client.post(CHAT, json=GOOD)).status_code == 429
        assert _refusals_counted() == base_before + 2
        assert _refusals_counted(ADAPTER) == adapter_before + 2
        engine.full = False
        assert (await client.post(CHAT, json=GOOD)).status_code == 200


async def test_a_body_longer_than_kept_is_counted_for_the_base() -> None:
    """A chunked body (no Content-Length) past the limit is not kept whole: the refusal is
    still the head's, counted for the base, and the next request on the connection is read
    from its own head."""
    async def chunks() -> AsyncIterator[bytes]:
        yield json.dumps({**GOOD, "model": ADAPTER}).encode()[:-1]
        yield b', "pad": "' + b"x" * 2000 + b'"}'

    async with served(adapters=True, max_body_bytes=1024) as (client, engine):
        base_before, adapter_before = _refusals_counted(), _refusals_counted(ADAPTER)
        r = await client.post(CHAT, content=chunks())
        assert r.status_code == 429, r.text
        assert _refusals_counted() == base_before + 1
        assert _refusals_counted(ADAPTER) == adapter_before
        r = await client.post(CHAT, json={**GOOD, "model": ADAPTER})
        assert r.status_code == 429 and _refusals_counted(ADAPTER) == adapter_before + 1
        engine.full = False
        assert (await client.post(CHAT, json=GOOD)).status_code == 200
