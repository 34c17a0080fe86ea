"""gRPC request ids, log lines and metrics, through a real grpc.aio server on loopback."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from podium.errors.interceptor import ErrorInterceptor
from podium.metrics import request_log, server
from podium.metrics.grpc_log import track_grpc
from tests.support.polling import async_eventually

SERVICE = "inference.GRPCInferenceService"


async def model_infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    async with track_grpc(context, "ModelInfer"):
        request_log.annotate(model="xgb", version="3")
        if request == b"bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "input 'x' has shape [2]")
        if request == b"crash":
            raise RuntimeError("backend died")
        return b"ok"


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer)}
    )
    srv = grpc.aio.server(interceptors=[ErrorInterceptor()])
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await srv.stop(None)


def count(code: str) -> float:
    labels = dict(
        model="xgb", version="3", protocol="kserve_grpc", endpoint="ModelInfer", code=code
    )
    return server.REGISTRY.get_sample_value("podium:requests_total", labels) or 0


def call(channel: grpc.aio.Channel, body: bytes, request_id: str | None = None) -> Any:
    method = channel.unary_unary(f"/{SERVICE}/ModelInfer")
    metadata = (("x-request-id", request_id),) if request_id else None
    return method(body, metadata=metadata)


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"x", "OK"), (b"bad", "INVALID_ARGUMENT"), (b"crash", "INTERNAL")],
    ids=["ok", "abort", "crash"],
)
async def test_rpcs_are_logged_and_counted_with_their_status(
    channel: grpc.aio.Channel, body: bytes, code: str
) -> None:
    out = io.StringIO()
    request_log.configure("json", out)
    before = count(code)
    rpc = call(channel, body, request_id="grpc-trace-7")
    if code == "OK":
        assert await rpc == b"ok"
    else:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc
        assert err.value.code().name == code
        # a crash shows no exception text, only the id its log line is under
        assert ("backend died" in err.value.details()) is False
        assert ("grpc-trace-7" in err.value.details()) is (body == b"crash")
    assert dict(await rpc.initial_metadata())["x-request-id"] == "grpc-trace-7"
    [line] = await _logged(out)
    assert (line["request_id"], line["status"], line["protocol"]) == (
        "grpc-trace-7",
        code,
        "kserve_grpc",
    )
    assert (line["model"], line["endpoint"]) == ("xgb", "ModelInfer")
    assert count(code) == before + 1


async def _logged(out: io.StringIO, timeout_s: float = 10) -> list[dict[str, Any]]:
    """The log lines once there are any: an aborted RPC's status reaches the client before the
    server's handler unwinds through track_grpc, which logs and counts it (once, the whole
    suite's load let the test read the log first)."""
    await async_eventually(out.getvalue, timeout_s)
    return [json.loads(x) for x in out.getvalue().splitlines()]


async def test_a_missing_id_is_generated(channel: grpc.aio.Channel) -> None:
    rpc = call(channel, b"x")
    assert await rpc == b"ok"
    rid = dict(await rpc.initial_metadata())["x-request-id"]
    assert len(rid) == 32
