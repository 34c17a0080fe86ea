"""KServe v2 gRPC requests to a full engine are refused before they are decoded or tokenized
(`repository.inference`: `Backend.refusal` first): ModelInfer with RESOURCE_EXHAUSTED, the
bound named and `retry-after` trailing metadata (what the HTTP routes' 429 says); a
ModelStreamInfer request with the refusal as its `error_message`, the stream staying open. Each
is counted for the model the request names, a LoRA adapter's under the adapter, and followed by
a good request once the engine has room. A real grpc.aio server over fake engines (vLLM's
admission check, `FullEngine`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.frontends.kserve_grpc import create_server
from podium.repository import ModelRepository
from tests.support.fake_backends import add_ready
from tests.support.full_engine import ADAPTER, GenerateLlm
from tests.support.ports import free_port


def _request(model: str, *, bad: bool = False) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id="g-1")
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"hello there")
    if bad:  # two raw tensors for one input: decoding it is INVALID_ARGUMENT
        request.raw_input_contents.extend([b"a", b"b"])
    return request


def _counted(model: str, method: str, code: str) -> float:
    from podium.metrics.server import REQUESTS

    return REQUESTS.labels(model, "1", "kserve_grpc", method, code)._value.get()


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[tuple[service_pb2_grpc.GRPCInferenceServiceStub,
                                          ModelRepository, GenerateLlm]]:
    repository = ModelRepository()
    backend = GenerateLlm()
    backend.serves_adapters = True
    backend.view = GenerateLlm(ADAPTER, backend.engine)  # runs on its base's engine
    add_ready(repository, backend)
    port = free_port()
    server = create_server(repository, port=port, server_ready=lambda: True, host="127.0.0.1")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield service_pb2_grpc.GRPCInferenceServiceStub(channel), repository, backend
    finally:
        await server.stop(0)


def _failed(repository: ModelRepository, model: str) -> int:
    row = repository.statistics(model, "1")[0]  # an adapter's own entry too
    return int(row["inference_stats"]["fail"]["count"])


@pytest.mark.parametrize("model", ["fake-llm", ADAPTER])
async def test_model_infer_is_refused_undecoded_with_retry_after_then_serves(
        model: str) -> None:
    async with served() as (stub, repository, backend):
        other = ADAPTER if model == "fake-llm" else "fake-llm"
        before = _counted(model, "ModelInfer", "RESOURCE_EXHAUSTED")
        other_before = _counted(other, "ModelInfer", "RESOURCE_EXHAUSTED")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            # a request whose decoding fails: refused, never decoded (not INVALID_ARGUMENT)
            await stub.ModelInfer(_request(model, bad=True))
        error = refused.value
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        assert "max_num_queued_reqs" in (error.details() or ""), error.details()
        assert ("retry-after", "1") in tuple(error.trailing_metadata() or ())
        assert backend.engine.checks == 1  # one admission check, nothing handed on
        assert backend.handed == [] and backend.view is not None and backend.view.handed == []
        assert _counted(model, "ModelInfer", "RESOURCE_EXHAUSTED") == before + 1
        assert _counted(other, "ModelInfer", "RESOURCE_EXHAUSTED") == other_before
        assert _failed(repository, model) == 1  # Triton's statistics: the model named
        backend.engine.full = False
        with pytest.raises(grpc.aio.AioRpcError) as bad:  # with room, its decode's 400
            await stub.ModelInfer(_request(model, bad=True))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad.value.details()
        assert "raw_input_contents" in (bad.value.details() or "")
        answer = await stub.ModelInfer(_request(model))
        assert answer.model_name == model and answer.outputs[0].name == "text_output"
        served_by = backend.handed if model == "fake-llm" else backend.view.handed
        assert served_by == [model]


async def test_a_stream_request_is_refused_undecoded_and_the_stream_serves_on() -> None:
    async with served() as (stub, repository, backend):
        call = stub.ModelStreamInfer()
        await call.write(_request("fake-llm", bad=True))
        refused = await call.read()
        assert not refused.HasField("infer_response")
        assert "the engine is overloaded" in refused.error_message, refused.error_message
        assert "max_num_queued_reqs" in refused.error_message
        assert backend.handed == [] and _failed(repository, "fake-llm") == 1
        backend.engine.full = False  # the same stream: its next request is served
        await call.write(_request("fake-llm"))
        served_message = await call.read()
        assert served_message.error_message == "", served_message.error_message
        response = served_message.infer_response
        assert response.id == "g-1" and response.outputs[0].name == "text_output"
        assert response.parameters["triton_final_response"].bool_param
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        assert backend.handed == ["fake-llm"]


async def test_a_stream_whose_request_is_refused_is_counted_refused_not_ok() -> None:
    """The stream's call ends OK (Triton's way: the refusal is the request's `error_message`),
    but podium:requests and the log line count the call RESOURCE_EXHAUSTED; a stream whose
    request is served is counted OK."""
    async with served() as (stub, _repository, backend):
        refused_before = _counted("fake-llm", "ModelStreamInfer", "RESOURCE_EXHAUSTED")
        ok_before = _counted("fake-llm", "ModelStreamInfer", "OK")
        call = stub.ModelStreamInfer()
        await call.write(_request("fake-llm"))
        assert "the engine is overloaded" in (await call.read()).error_message
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        assert _counted("fake-llm", "ModelStreamInfer", "RESOURCE_EXHAUSTED") \
            == refused_before + 1
        assert _counted("fake-llm", "ModelStreamInfer", "OK") == ok_before
        backend.engine.full = False
        call = stub.ModelStreamInfer()
        await call.write(_request("fake-llm"))
        assert (await call.read()).error_message == ""
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        assert _counted("fake-llm", "ModelStreamInfer", "OK") == ok_before + 1
        assert _counted("fake-llm", "ModelStreamInfer", "RESOURCE_EXHAUSTED") \
            == refused_before + 1


async def test_an_engine_with_room_is_asked_once_per_request() -> None:
    """No engine is full: the request takes its usual path, its decode's errors its own, and
    the admission check runs once per request (the check is the refusal's whole cost)."""
    async with served() as (stub, _repository, backend):
        backend.engine.full = False
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.ModelInfer(_request("nobody"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert backend.engine.checks == 0  # an unknown model asks no engine
        request = _request("fake-llm")
        request.parameters["sampling"].string_param = json.dumps({"max_tokens": 2})
        await stub.ModelInfer(request)
        assert backend.engine.checks == 1 and backend.handed == ["fake-llm"]
