"""The instance app with a fake backend: routing, errors, auth, limits, readiness.

Fast (no engine); the same behaviours are exercised on the real engine in test_openai_real.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from podium.repository.entry import UNLOADING
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import FakeLlmBackend, add_ready
from tests.support.polling import async_eventually
from tests.support.ports import free_port

CHAT = "/v1/chat/completions"
GOOD = {"model": "fake-llm", "messages": [{"role": "user", "content": "hello there"}]}


def _client(**config) -> tuple[httpx.AsyncClient, Instance, FakeLlmBackend]:
    instance = Instance(ServerConfig(grpc_port=-1, **config))
    backend = FakeLlmBackend()
    add_ready(instance.repository, backend)
    instance.booted = True
    transport = httpx.ASGITransport(app=build_app(instance))
    return httpx.AsyncClient(transport=transport, base_url="http://t"), instance, backend


async def _good(client: httpx.AsyncClient, **headers: str) -> None:
    r = await client.post(CHAT, json=GOOD, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hello there"


BAD = [
    pytest.param(b"{not json", 400, "not valid JSON", id="non-json"),
    pytest.param(b"[]", 400, "got an array", id="list-body"),
    pytest.param(b"null", 400, "got null", id="null-body"),
    pytest.param(b"", 400, "empty", id="empty-body"),
    pytest.param(b"[" * 3000, 400, "deeper than 64 levels", id="3000-deep"),
    pytest.param(json.dumps({"messages": []}).encode(), 400, "'model' is required",
                 id="missing-model"),
    pytest.param(json.dumps({**GOOD, "model": 7}).encode(), 400, "'model' is required",
                 id="model-not-string"),
    pytest.param(json.dumps({**GOOD, "model": "nope"}).encode(), 404, "not served",
                 id="unknown-model"),
    pytest.param(json.dumps({**GOOD, "model": "fake-llm@9"}).encode(), 404, "no version",
                 id="unknown-version"),
    pytest.param(json.dumps({**GOOD, "frobnicate": 1}).encode(), 400, "frobnicate",
                 id="unknown-field"),
    pytest.param(json.dumps({**GOOD, "messages": "hi"}).encode(), 400, "messages",
                 id="messages-wrong-type"),
    pytest.param(json.dumps({**GOOD, "temperature": "hot"}).encode(), 400, "temperature",
                 id="temperature-wrong-type"),
    pytest.param(json.dumps({**GOOD, "response_format": {"type": "json_schema", "json_schema":
                 {"name": "x", "schema": {"type": 12}}}}).encode(), 400, "JSON Schema",
                 id="invalid-json-schema"),
    pytest.param(json.dumps({**GOOD, "min_tokens": 2, "constraint": {
        "type": "choice", "choices": ["a"]}}).encode(), 400, "min_tokens",
        id="min-tokens-with-constraint"),
    pytest.param(json.dumps({**GOOD, "constraint": {"type": "choice", "choices": []}}).encode(),
                 400, "choices", id="empty-constraint"),
    pytest.param(b'{"model": "fake-llm", "messages": [], "pad": "' + b"x" * 5000 + b'"}', 413,
                 "limit", id="oversized-body"),
]


@pytest.mark.parametrize(("body", "status", "needle"), BAD)
async def test_bad_request_then_good_one(body: bytes, status: int, needle: str) -> None:
    client, _, _ = _client(max_body_bytes=4096)
    async with client:
        r = await client.post(CHAT, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert needle in error["message"]
        assert error["code"] == status and error["type"]
        await _good(client)


async def test_streaming_passes_sse_through() -> None:
    client, _, _ = _client()
    async with client:
        r = await client.post(CHAT, json={**GOOD, "stream": True})
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.text.count("data: ") == 3 and r.text.endswith("data: [DONE]\n\n")


async def test_models_lists_ready_llms() -> None:
    client, _, _ = _client()
    async with client:
        r = await client.get("/v1/models")
        assert [m["id"] for m in r.json()["data"]] == ["fake-llm"]
        assert (await client.get("/v1/models/fake-llm")).json()["version"] == "1"
        assert (await client.get("/v1/models/nope")).status_code == 404


async def test_versioned_model_id_routes_to_that_version() -> None:
    client, instance, _ = _client()
    v2 = FakeLlmBackend(version="2")
    add_ready(instance.repository, v2)
    async with client:
        r = await client.post(CHAT, json={**GOOD, "model": "fake-llm@2"})
        assert r.status_code == 200
        assert v2.chat.requests and v2.chat.requests[0].model == "fake-llm"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "secret"}],
                         ids=["missing", "wrong", "not-bearer"])
async def test_api_key_required_except_liveness(headers: dict[str, str]) -> None:
    client, _, _ = _client(api_key="secret")
    async with client:
        assert (await client.get("/health")).status_code == 200
        for path in ("/health/ready", "/v1/models"):
            r = await client.get(path, headers=headers)
            assert r.status_code == 401
        r = await client.post(CHAT, json=GOOD, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        await _good(client, Authorization="Bearer secret")


async def test_readiness_follows_boot_and_draining() -> None:
    client, instance, _ = _client()
    async with client:
        instance.booted = False
        r = await client.get("/health/ready")
        assert r.status_code == 503 and r.json()["status"] == "starting"
        assert (await client.get("/health")).status_code == 200
        instance.booted = True
        assert (await client.get("/health/ready")).status_code == 200
        instance.draining = True
        r = await client.get("/health/ready")
        assert r.status_code == 503 and r.json()["status"] == "draining"


async def test_unload_waits_for_in_flight_request() -> None:
    client, instance, backend = _client()
    backend.chat.gate = asyncio.Event()
    async with client:
        request = asyncio.create_task(client.post(CHAT, json=GOOD))
        while not backend.chat.requests:
            await asyncio.sleep(0.01)
        entry = instance.repository.find("fake-llm")
        unload = asyncio.create_task(instance.repository.unload("fake-llm"))
        assert await async_eventually(lambda: entry.state == UNLOADING)
        assert not unload.done(), "unload must wait for the in-flight request"
        r = await client.post(CHAT, json=GOOD)
        assert r.status_code in (404, 503)  # no new requests on an unloading model
        backend.chat.gate.set()
        assert (await request).status_code == 200
        await unload


async def test_models_report_when_each_version_became_ready() -> None:
    """`created` is the version's load time, not the time of the listing."""
    client, instance, _ = _client()
    add_ready(instance.repository, FakeLlmBackend(version="2"), loaded_at=1_700_000_000)
    async with client:
        cards = {m["version"]: m for m in (await client.get("/v1/models")).json()["data"]}
        assert cards["2"]["created"] == 1_700_000_000
        one = (await client.get("/v1/models/fake-llm@2")).json()
        assert one["created"] == 1_700_000_000 and one["version"] == "2"


async def test_headers_over_the_limit_are_431_then_good() -> None:
    """The request head is bounded by the HTTP protocol `podium serve` serves the app with
    (`serve.uvicorn_config`), so this needs a real server."""
    import uvicorn

    from podium.server.serve import uvicorn_config

    port = free_port()
    config = ServerConfig(host="127.0.0.1", http_port=port, grpc_port=-1, max_header_bytes=4096)
    instance = Instance(config)
    add_ready(instance.repository, FakeLlmBackend())
    instance.booted = True
    server = uvicorn.Server(uvicorn_config(build_app(instance), config))
    task = asyncio.create_task(server.serve())
    try:
        assert await async_eventually(lambda: server.started, 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.post(CHAT, json=GOOD, headers={"x-big": "a" * 5000})
            assert r.status_code == 431, r.text
            assert "limit of 4096 bytes (--max-header-bytes)" in r.json()["error"]["message"]
            r = await client.get("/v2/health/live", headers={"x-big": "a" * 5000})
            assert r.status_code == 431 and "--max-header-bytes" in r.json()["error"]
            await _good(client)
    finally:
        server.should_exit = True
        await task
