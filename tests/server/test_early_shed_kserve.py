"""A KServe v2 request to a full engine is refused from its head (`server.early_shed`): the
path names the model, so infer, generate and generate_stream (unversioned and versioned) get
the 429 the full path gives (Triton's error body naming the bound, Retry-After, X-Request-Id),
counted in `podium:requests` and Triton's statistics for the model the path names, a LoRA
adapter's under the adapter, never its base. Its body is never read (a body that is not even
JSON gets the 429). What the head cannot decide (an unknown model, an engine with room) takes
the full path. Each refusal is followed by a good request once the engine has room. A real
uvicorn server with fake engines: the early answer is its protocol's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from podium.backends.base import InferenceRequest, InferenceResponse
from podium.backends.vllm import checks
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from podium.server.serve import uvicorn_config
from tests.support.fake_backends import add_ready
from tests.support.full_engine import ADAPTER, GenerateLlm
from tests.support.polling import async_eventually
from tests.support.ports import free_port

GOOD = {"text_input": "hello there", "parameters": {"max_tokens": 4}}
class KServeLlm(GenerateLlm):
    """`GenerateLlm` whose engine also checks admission as vLLM's `generate` does (the full
    path's 429)."""

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        with checks.engine_rejections():
            self.engine.check_admission()
        return await super().infer(request)


def _counted(model: str, endpoint: str, code: str = "429") -> float:
    from podium.metrics.server import REQUESTS

    return REQUESTS.labels(model, "1", "kserve_http", endpoint, code)._value.get()


@contextlib.asynccontextmanager
async def served(**config: object) -> AsyncIterator[tuple[httpx.AsyncClient, KServeLlm]]:
    port = free_port()
    settings = ServerConfig(host="127.0.0.1", http_port=port, grpc_port=-1, **config)
    instance = Instance(settings)
    backend = KServeLlm()
    backend.serves_adapters = True
    backend.view = KServeLlm(ADAPTER, backend.engine)  # its base's engine
    add_ready(instance.repository, backend)
    instance.booted = True
    server = uvicorn.Server(uvicorn_config(build_app(instance), settings, instance=instance))
    task = asyncio.create_task(server.serve())
    try:
        assert await async_eventually(lambda: server.started, 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield client, backend
    finally:
        server.should_exit = True
        await task


@pytest.mark.parametrize("path", ["/v2/models/fake-llm/infer",
                                  "/v2/models/fake-llm/versions/1/generate",
                                  "/v2/models/fake-llm/generate_stream"])
async def test_each_route_is_refused_from_the_head_then_serves(
        path: str, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = path.replace("fake-llm", "{model}").replace("/versions/1/",
                                                           "/versions/{version}/")
    async with served() as (client, backend):
        before = _counted("fake-llm", endpoint)
        stats = (await client.get("/v2/models/fake-llm/stats")).json()
        failed = stats["model_stats"][0]["inference_stats"]["fail"]["count"]
        # not even JSON: answered from the head (the full path would answer its 400)
        r = await client.post(path, content=b"{not json", headers={"x-request-id": "k-1"})
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1" and r.headers["x-request-id"] == "k-1"
        assert set(r.json()) == {"error"} and "max_num_queued_reqs" in r.json()["error"]
        assert _counted("fake-llm", endpoint) == before + 1
        assert f"k-1 POST {path} 429" in capsys.readouterr().err
        stats = (await client.get("/v2/models/fake-llm/stats")).json()
        assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == failed + 1
        assert backend.handed == []
        backend.engine.full = False
        if path.endswith("/infer"):
            r = await client.post(path, json={"inputs": [{
                "name": "text_input", "datatype": "BYTES", "shape": [1],
                "data": ["hello there"]}]})
        else:
            r = await client.post(path, json=GOOD)
        assert r.status_code == 200, r.text
        assert backend.handed == ["fake-llm"]


async def test_the_early_refusal_is_the_full_paths() -> None:
    """The same 429, byte for byte, as the full path gives when the head cannot decide (a
    request on a connection whose earlier answer is still being written is the app's): here,
    the engine's own check at `generate` (a body that is JSON, sent with Expect: 100-continue,
    which the head leaves to the app)."""
    async with served() as (client, _backend):
        path = "/v2/models/fake-llm/generate"
        early = await client.post(path, json=GOOD)
        expect = {"expect": "100-continue"}
        full = await client.post(path, json=GOOD, headers=expect)
        # the app's indeed: there a body that is not JSON is read, and is its 400
        assert (await client.post(path, content=b"{not json", headers=expect)
                ).status_code == 400
        assert early.status_code == full.status_code == 429
        assert early.content == full.content
        assert early.headers["retry-after"] == full.headers["retry-after"] == "1"
        assert early.headers["content-type"] == full.headers["content-type"]


async def test_an_adapters_refusal_is_counted_for_the_adapter_not_its_base() -> None:
    """The adapter runs on its base's engine: the engine's refusal is the adapter's 429, on
    `podium:requests` with model=<adapter>; the base's count does not move."""
    endpoint = "/v2/models/{model}/generate"
    async with served() as (client, backend):
        adapter_before = _counted(ADAPTER, endpoint)
        base_before = _counted("fake-llm", endpoint)
        r = await client.post(f"/v2/models/{ADAPTER}/generate", content=b"{not json")
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert _counted(ADAPTER, endpoint) == adapter_before + 1
        assert _counted("fake-llm", endpoint) == base_before
        backend.engine.full = False
        r = await client.post(f"/v2/models/{ADAPTER}/generate", json=GOOD)
        assert r.status_code == 200, r.text
        assert backend.view is not None and backend.view.handed == [ADAPTER]
        assert _counted(ADAPTER, endpoint, "200") >= 1


async def test_what_the_head_cannot_decide_takes_the_full_path() -> None:
    async with served(api_key="k-right") as (client, backend):
        r = await client.post("/v2/models/nobody/generate", json=GOOD,
                              headers={"authorization": "Bearer k-right"})
        assert r.status_code == 404, r.text  # an unknown model: its 404, even when full
        r = await client.post("/v2/models/fake-llm/generate", json=GOOD,
                              headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401, r.text  # a key that does not pass: its 401
        r = await client.post("/v2/models/fake-llm/versions/7/generate", json=GOOD,
                              headers={"authorization": "Bearer k-right"})
        assert r.status_code == 404, r.text  # no such version
        backend.engine.full = False
        r = await client.post("/v2/models/fake-llm/generate", content=b"{not json",
                              headers={"authorization": "Bearer k-right"})
        assert r.status_code == 400, r.text  # an engine with room: the body is read
        r = await client.post("/v2/models/fake-llm/generate", json=GOOD,
                              headers={"authorization": "Bearer k-right"})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/v2/models/m/infer", "/v2/models/m/versions/2/infer",
                                  "/v2/models/m/generate_stream", "/v2/models/m/score",
                                  "/v2/models/m/versions//infer", "/v2/models//infer",
                                  "/v2/models/m/infer/", "/v2/models/m/x/infer"])
def test_kserve_route_parses_the_inference_paths_only(path: str) -> None:
    from podium.server.early_shed import kserve_route

    route = kserve_route(path)
    expected = {"/v2/models/m/infer": ("m", None, "/v2/models/{model}/infer"),
                "/v2/models/m/versions/2/infer": (
                    "m", "2", "/v2/models/{model}/versions/{version}/infer"),
                "/v2/models/m/generate_stream": (
                    "m", None, "/v2/models/{model}/generate_stream")}.get(path)
    assert (None if route is None else (route.model, route.version, route.endpoint)) == expected
