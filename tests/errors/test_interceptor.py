"""One interceptor maps what any method raised to its gRPC status: unary and streaming, through
a real grpc.aio server on loopback, called with the generated KServe stubs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.errors import InvalidArgument, NotFound, Unavailable
from podium.errors.interceptor import ErrorInterceptor
from podium.frontends.kserve_grpc import create_server
from podium.repository import ModelRepository

SERVICE = "test.Errors"
RAISES = {b"not-found": NotFound("model 'ghost' is not served here", param="model"),
          b"unavailable": Unavailable("model 'm' has no ready version yet"),
          b"bad": InvalidArgument("input 'x' has shape [2]; the model takes [3]"),
          b"bug": RuntimeError("secret-path /etc/shadow")}
CASES = [
    pytest.param(b"not-found", "NOT_FOUND", "model 'ghost' is not served here", id="not-found"),
    pytest.param(b"unavailable", "UNAVAILABLE", "no ready version", id="unavailable"),
    pytest.param(b"bad", "INVALID_ARGUMENT", "takes [3]", id="invalid-argument"),
    pytest.param(b"bug", "INTERNAL", "internal error (request id", id="unexpected"),
]


async def unary(request: bytes, _context: Any) -> bytes:
    if request in RAISES:
        raise RAISES[request]
    return b"ok:" + request


async def server_stream(request: bytes, _context: Any) -> AsyncIterator[bytes]:
    yield b"first"  # an error after a message has gone still ends the call with its status
    if request in RAISES:
        raise RAISES[request]
    yield b"ok:" + request


async def bidi(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        if request in RAISES:
            raise RAISES[request]
        yield b"ok:" + request


async def relayed(_request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "upstream took too long")
    raise AssertionError("abort raises")


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Relayed": grpc.unary_unary_rpc_method_handler(relayed),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await server.stop(None)


async def _expect(call: Any, code: str, needle: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code().name == code
    assert needle in err.value.details() and "secret-path" not in err.value.details()


@pytest.mark.parametrize(("request_body", "code", "needle"), CASES)
async def test_unary_errors_map_to_their_status(channel: grpc.aio.Channel, request_body: bytes,
                                                code: str, needle: str) -> None:
    method = channel.unary_unary(f"/{SERVICE}/Unary")
    await _expect(method(request_body), code, needle)
    assert await method(b"good") == b"ok:good"  # the server keeps serving


@pytest.mark.parametrize(("request_body", "code", "needle"), CASES)
async def test_server_streaming_errors_map_to_their_status(
        channel: grpc.aio.Channel, request_body: bytes, code: str, needle: str) -> None:
    call = channel.unary_stream(f"/{SERVICE}/ServerStream")(request_body)
    assert await call.read() == b"first"
    await _expect(call.read(), code, needle)
    assert [m async for m in channel.unary_stream(f"/{SERVICE}/ServerStream")(b"good")] == [
        b"first", b"ok:good"]


@pytest.mark.parametrize(("request_body", "code", "needle"), CASES)
async def test_bidi_streaming_errors_map_to_their_status(
        channel: grpc.aio.Channel, request_body: bytes, code: str, needle: str) -> None:
    call = channel.stream_stream(f"/{SERVICE}/Bidi")()
    await call.write(b"one")
    assert await call.read() == b"ok:one"
    await call.write(request_body)
    await _expect(call.read(), code, needle)


async def test_an_explicit_abort_passes_through(channel: grpc.aio.Channel) -> None:
    await _expect(channel.unary_unary(f"/{SERVICE}/Relayed")(b""), "DEADLINE_EXCEEDED",
                  "upstream took too long")


async def test_the_unexpected_error_is_logged_with_the_id_the_client_sees(
        channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="podium.errors"), \
            pytest.raises(grpc.aio.AioRpcError) as err:
        await channel.unary_unary(f"/{SERVICE}/Unary")(b"bug")
    request_id = err.value.details().split("request id ")[1].split(")")[0]
    [record] = caplog.records
    assert request_id in record.getMessage() and isinstance(record.exc_info[1], RuntimeError)


# the KServe service's own methods, which raise and no longer catch -----------------------------
KSERVE = [
    pytest.param("ModelMetadata", service_pb2.ModelMetadataRequest(name="ghost"), "NOT_FOUND",
                 id="metadata-unknown-model"),
    pytest.param("ModelConfig", service_pb2.ModelConfigRequest(name="ghost"), "NOT_FOUND",
                 id="config-unknown-model"),
    pytest.param("ModelStatistics", service_pb2.ModelStatisticsRequest(name="ghost"),
                 "NOT_FOUND", id="statistics-unknown-model"),
    pytest.param("RepositoryModelUnload",
                 service_pb2.RepositoryModelUnloadRequest(model_name="ghost"), "NOT_FOUND",
                 id="unload-unknown-model"),
    pytest.param("ModelInfer", service_pb2.ModelInferRequest(model_name="ghost"), "NOT_FOUND",
                 id="infer-unknown-model"),
]


@pytest.mark.parametrize(("method", "request_message", "code"), KSERVE)
async def test_kserve_methods_answer_with_the_status_of_what_they_raised(
        method: str, request_message: Any, code: str) -> None:
    server = create_server(ModelRepository(), port=0, host="127.0.0.1", server_ready=lambda: True)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await getattr(stub, method)(request_message)
            assert err.value.code().name == code and "'ghost'" in err.value.details()
            live = await stub.ServerLive(service_pb2.ServerLiveRequest())
            assert live.live
    finally:
        await server.stop(None)


async def test_a_stream_request_fails_alone_in_band_naming_the_calls_request_id() -> None:
    repository = ModelRepository()
    server = create_server(repository, port=0, host="127.0.0.1", server_ready=lambda: True)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            call = stub.ModelStreamInfer(metadata=(("x-request-id", "stream-trace-3"),))
            await call.write(service_pb2.ModelInferRequest(model_name="ghost", id="a"))
            first = await call.read()
            assert "'ghost'" in first.error_message  # Triton's way: in band, stream open
            repository.lease = _boom  # type: ignore[method-assign]
            await call.write(service_pb2.ModelInferRequest(model_name="ghost", id="b"))
            second = await call.read()
            assert "internal error (request id stream-trace-3)" in second.error_message
            assert "secret" not in second.error_message
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
    finally:
        await server.stop(None)


def _boom(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("secret-path /etc/shadow")
