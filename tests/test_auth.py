"""One API-key check for instance, gateway and control plane, over HTTP and gRPC."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest

from podium.auth import ApiKeyInterceptor, ApiKeyMiddleware, ApiKeys
from podium.errors import Unauthorized
from podium.errors.interceptor import ErrorInterceptor

KEYS = ["old-key", "new-key"]


@pytest.mark.parametrize(("given", "ok"), [
    ("Bearer old-key", True), ("Bearer new-key", True), (b"Bearer new-key", True),
    ("Bearer other", False), ("old-key", False), ("Bearer old-key ", False), ("", False),
    (None, False),
], ids=["first-key", "second-key", "bytes", "wrong", "not-bearer", "trailing-space", "empty",
        "missing"])
def test_any_configured_key_is_accepted_and_nothing_else(given: Any, ok: bool) -> None:
    keys = ApiKeys(KEYS)
    if ok:
        keys.check(given, how="it")
        return
    with pytest.raises(Unauthorized, match="missing" if not given else "wrong"):
        keys.check(given, how="it")


def test_an_empty_key_is_refused_at_configuration() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ApiKeys(["k", ""])


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(("shape_of", "path", "error"), [
    (None, "/v1/models", lambda e: e["type"] == "authentication_error" and e["code"] == 401),
    (None, "/v2/models/m/infer", lambda e: isinstance(e, str)),
    (lambda _p: "control", "/v2/anything", lambda e: e["code"] == 401),
], ids=["instance-openai", "instance-kserve", "control"])
async def test_the_middleware_refuses_in_the_routes_shape_then_serves(
        shape_of: Any, path: str, error: Any) -> None:
    extra = {"shape_of": shape_of} if shape_of else {}
    app = ApiKeyMiddleware(_ok, api_key=KEYS, **extra)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        refused = await client.get(path)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert error(refused.json()["error"])
        assert "Authorization: Bearer" in json.dumps(refused.json())
        assert (await client.get("/health")).status_code == 200  # liveness stays open
        good = await client.get(path, headers={"Authorization": "Bearer new-key"})
        assert good.status_code == 200 and good.text == "ok"


async def _unary(request: bytes, _context: Any) -> bytes:
    return b"ok:" + request


async def _stream(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        yield b"ok:" + request


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server(interceptors=[ErrorInterceptor(), ApiKeyInterceptor(KEYS)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {
            "ServerLive": grpc.unary_unary_rpc_method_handler(_unary),
            "ModelInfer": grpc.unary_unary_rpc_method_handler(_unary),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(_stream)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await server.stop(None)


@pytest.mark.parametrize("metadata", [None, (("authorization", "Bearer nope"),)],
                         ids=["missing", "wrong"])
async def test_grpc_refuses_unary_and_streaming_calls_then_serves(
        channel: grpc.aio.Channel, metadata: Any) -> None:
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await infer(b"x", metadata=metadata)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer <key>" in err.value.details()
    call = stream(metadata=metadata)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        # The server refuses at the call's start; whether the client's write lands
        # before that refusal arrives is a race, so the refusal may surface at either.
        await call.write(b"x")
        await call.read()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
    assert await live(b"probe") == b"ok:probe"  # liveness carries no key
    good = (("authorization", "Bearer old-key"),)
    assert await infer(b"y", metadata=good) == b"ok:y"
    call = stream(metadata=good)
    await call.write(b"z")
    assert await call.read() == b"ok:z"
    await call.done_writing()
