"""Overload is a fast 429 / RESOURCE_EXHAUSTED with Retry-After on every path, never a 5xx:
the dynamic batcher's full queue, and vLLM's admission control (QueueOverflowError,
MaxQueuedTokensError) on OpenAI /v1, KServe /v2 HTTP and KServe gRPC. Each refusal is
followed by a good request on the same server."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.package.package import open_package, write_manifest
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_llm_instance import llm_instance, served
from tests.support.openai_instance import CHAT, GOOD, client_for, openai_app

PROMPT = {"text_input": "what is the capital of France?"}


def _refusals() -> list[Any]:
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    return [pytest.param(QueueOverflowError, "max_num_queued_reqs", id="queued-reqs"),
            pytest.param(MaxQueuedTokensError, "max_num_queued_tokens", id="queued-tokens")]


def _assert_429(r: Any, limit: str) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "1"
    assert limit in r.json()["error"] and "retry later" in r.json()["error"]


def _grpc_request() -> Any:
    request = service_pb2.ModelInferRequest(model_name="llm")
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(PROMPT["text_input"].encode())
    return request


@pytest.mark.parametrize(("refusal", "limit"), _refusals())
async def test_the_engines_refusal_is_a_429_on_kserve_http(tmp_path: Path, refusal: type,
                                                          limit: str) -> None:
    async with llm_instance(tmp_path) as (client, engine, _):
        engine.refusal = refusal
        infer = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                             "data": [PROMPT["text_input"]]}]}
        _assert_429(await client.post("/v2/models/llm/infer", json=infer), limit)
        _assert_429(await client.post("/v2/models/llm/generate", json=PROMPT), limit)
        _assert_429(await client.post("/v2/models/llm/generate_stream", json=PROMPT), limit)
        engine.refusal = None
        r = await client.post("/v2/models/llm/generate", json=PROMPT)
        assert r.status_code == 200 and r.json()["text_output"], r.text


@pytest.mark.parametrize(("refusal", "limit"), _refusals())
async def test_the_engines_refusal_is_resource_exhausted_on_grpc(tmp_path: Path, refusal: type,
                                                                limit: str) -> None:
    async with llm_instance(tmp_path) as (_, engine, target):
        engine.refusal = refusal
        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            call = stub.ModelInfer(_grpc_request(), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert limit in refused.value.details()
            assert ("retry-after", "1") in tuple(await call.trailing_metadata())
            engine.refusal = None
            answer = await stub.ModelInfer(_grpc_request(), timeout=10)
            assert answer.raw_output_contents or answer.outputs


class RefusingServing:
    """vLLM's serving objects refusing as vLLM 0.32 does: raising from the pre-flight check,
    or answering with its own 503 error response when the engine refused inside."""

    def __init__(self) -> None:
        self.refusal: type[Exception] | None = None
        self.answer_with_response = False

    async def create_chat_completion(self, request: Any, raw: Any) -> Any:
        from types import SimpleNamespace

        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response,
        )

        if self.refusal is not None:
            if self.answer_with_response:
                return create_error_response(self.refusal())
            raise self.refusal()
        return SimpleNamespace(model_dump=lambda **_: {"object": "fake", "choices": [
            {"index": 0, "text": "ok"}]})


@pytest.mark.parametrize("answered", [False, True], ids=["raised", "error-response"])
@pytest.mark.parametrize(("refusal", "limit"), _refusals())
async def test_the_engines_refusal_is_a_429_in_the_openai_shape(refusal: type, limit: str,
                                                               answered: bool) -> None:
    from types import SimpleNamespace

    app, _ = openai_app()
    backend = app.state.instance.repository.entries()[0].backend
    serving = RefusingServing()
    backend.state = SimpleNamespace(openai_serving_chat=serving)
    async with client_for(app) as client:
        serving.refusal, serving.answer_with_response = refusal, answered
        r = await client.post(CHAT, json=GOOD[CHAT])
        assert r.status_code == 429, r.text
        assert r.headers["Retry-After"] == "1"
        error = r.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == 429
        assert error["param"] == limit and limit in error["message"]
        serving.refusal = None
        assert (await client.post(CHAT, json=GOOD[CHAT])).status_code == 200


# -- the dynamic batcher's bounded queue, through both HTTP shapes and gRPC ---------------------
@contextlib.asynccontextmanager
async def slow_python_instance(tmp_path: Path, batching: dict[str, Any] | None = None,
                               **config: Any
                               ) -> AsyncIterator[tuple[Any, threading.Event, str]]:
    """An instance over a python model that blocks until the event is set (max batch 1);
    `batching` is its dynamic_batching section (None: off)."""
    root = tmp_path / "slow"
    root.mkdir()
    (root / "model.py").write_text(
        "import numpy as np\n"
        "GATE = None\n"
        "class Model:\n"
        "    def initialize(self, config):\n"
        "        pass\n"
        "    def execute(self, requests):\n"
        "        GATE.wait(10)\n"
        "        return [{'y': r['x'] * 2} for r in requests]\n")
    package = open_package(write_manifest(root, {
        "name": "slow", "backend": "python", "max_batch_size": 1,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
        "dynamic_batching": batching}).root)
    instance = Instance(ServerConfig(grpc_port=-1, **config))
    entry = await instance.repository.load(package)
    gate = threading.Event()
    sys.modules[type(entry.backend._instance).__module__].GATE = gate  # the model's module
    try:
        async with served(instance) as (client, grpc_url):
            try:
                yield client, gate, grpc_url
            finally:
                gate.set()  # before the gRPC server waits out its grace
    finally:
        await instance.repository.unload_all(timeout_s=5)


ROW = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}]}


async def _occupy(client: Any, count: int) -> list[asyncio.Future[Any]]:
    """`count` requests sent one after another, each given time to reach the model or queue."""
    busy = []
    for _ in range(count):
        busy.append(asyncio.ensure_future(client.post("/v2/models/slow/infer", json=ROW)))
        await asyncio.sleep(0.1)
    return busy


async def test_a_full_batcher_queue_is_a_429_on_http_and_resource_exhausted_on_grpc(
        tmp_path: Path) -> None:
    async with slow_python_instance(tmp_path, {"max_queue": 1}) as (client, gate, target):
        # one request in the model, one queued (max_queue 1): the next is refused
        busy = await _occupy(client, 2)
        r = await client.post("/v2/models/slow/infer", json=ROW)
        assert r.status_code == 429, r.text
        assert r.headers["Retry-After"] == "1"
        assert "max_queue=1" in r.json()["error"]
        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="slow")
            tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
            tensor.contents.fp32_contents.append(1.5)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            gate.set()
            assert [b.status_code for b in await asyncio.gather(*busy)] == [200, 200]
            answer = await stub.ModelInfer(request, timeout=10)
            assert answer.outputs[0].name == "y"


async def test_the_max_queue_flag_overrides_the_package(tmp_path: Path) -> None:
    async with slow_python_instance(tmp_path, {"max_queue": 1}, max_queue=3) as (
            client, gate, _):
        busy = await _occupy(client, 4)  # one running, three queued: all admitted
        r = await client.post("/v2/models/slow/infer", json=ROW)
        assert r.status_code == 429 and "max_queue=3" in r.json()["error"], r.text
        gate.set()
        assert [b.status_code for b in await asyncio.gather(*busy)] == [200] * 4


async def test_an_expired_queue_wait_is_a_429(tmp_path: Path) -> None:
    async with slow_python_instance(tmp_path, {}, queue_timeout_ms=100) as (
            client, gate, _):
        busy = asyncio.ensure_future(client.post("/v2/models/slow/infer", json=ROW))
        await asyncio.sleep(0.2)
        r = await client.post("/v2/models/slow/infer", json=ROW)
        assert r.status_code == 429, r.text
        assert "waited 0.1s in its queue" in r.json()["error"]
        gate.set()
        assert (await busy).status_code == 200
        assert (await client.post("/v2/models/slow/infer", json=ROW)).status_code == 200


async def test_a_model_without_a_batcher_is_bounded_too(tmp_path: Path) -> None:
    async with slow_python_instance(tmp_path, None, max_queue=2) as (client, gate, _):
        busy = await _occupy(client, 2)
        r = await client.post("/v2/models/slow/infer", json=ROW)
        assert r.status_code == 429 and "2 requests are in flight" in r.json()["error"], r.text
        assert r.headers["Retry-After"] == "1"
        gate.set()
        assert [b.status_code for b in await asyncio.gather(*busy)] == [200, 200]
        assert (await client.post("/v2/models/slow/infer", json=ROW)).status_code == 200


@pytest.mark.parametrize(("refusal", "limit"), _refusals())
async def test_a_full_engine_refuses_before_the_body_is_validated(refusal: type,
                                                                 limit: str) -> None:
    from types import SimpleNamespace

    app, serving = openai_app()
    backend = app.state.instance.repository.entries()[0].backend
    full = SimpleNamespace(asked=[])

    def check_admission(n: int = 1) -> None:  # vLLM's AsyncLLM.check_admission
        full.asked.append(n)
        if refusal is not None:
            raise refusal()

    backend.engine = SimpleNamespace(check_admission=check_admission)
    async with client_for(app) as client:
        r = await client.post(CHAT, json={**GOOD[CHAT], "n": 2})
        _assert_openai_429(r, limit)
        assert serving.requests == [] and full.asked == [2]  # vLLM's serving never ran
        refusal = None
        assert (await client.post(CHAT, json=GOOD[CHAT])).status_code == 200
        assert (await client.post("/tokenize", json={"prompt": "x"})).status_code == 200
        assert full.asked == [2, 1]  # tokenize adds no engine request: not checked


def _assert_openai_429(r: Any, limit: str) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "1"
    assert r.json()["error"]["param"] == limit
