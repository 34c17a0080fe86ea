"""API keys for the instance, the gateway and the control plane, over HTTP and gRPC.

A caller sends `Authorization: Bearer <key>` (HTTP header or gRPC metadata); any one of the
configured keys is accepted, each compared in constant time. Liveness stays open: probes carry
no credentials. A refusal is 401 / UNAUTHENTICATED, rendered like every other error.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from podium.errors import Unauthorized
from podium.errors.interceptor import guarded
from podium.errors.render import Shape, instance_shape, json_error

LIVENESS_PATHS = frozenset({"/health", "/health/live", "/v2/health/live"})
OPEN_METHODS = frozenset({"/inference.GRPCInferenceService/ServerLive"})
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class ApiKeys:
    """The keys a server accepts; `check` raises Unauthorized for anything else."""

    def __init__(self, keys: str | Sequence[str]) -> None:
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys or not all(keys):
            raise ValueError("an API key must be a non-empty string")
        self._expected = [f"Bearer {key}".encode() for key in keys]

    def check(self, given: str | bytes | None, *, how: str) -> None:
        """Accept `given` (the Authorization value) or raise Unauthorized saying `how` to send
        a key."""
        value = given.encode() if isinstance(given, str) else given or b""
        # every key is compared, so the time taken does not tell which one nearly matched
        matched = [hmac.compare_digest(value, expected) for expected in self._expected]
        if not any(matched):
            reason = "missing" if not value else "wrong"
            raise Unauthorized(f"API key {reason}: send {how} with the key the server was "
                               "started with (--api-key)")


class ApiKeyMiddleware:
    """ASGI middleware: every HTTP route but liveness (and /metrics if open) needs a key."""

    def __init__(self, app: ASGIApp, *, api_key: str | Sequence[str], metrics_open: bool = False,
                 shape_of: Callable[[str], Shape] = instance_shape) -> None:
        self.app = app
        self.keys = ApiKeys(api_key)
        self.open_paths = LIVENESS_PATHS | ({"/metrics"} if metrics_open else set())
        self.shape_of = shape_of

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        try:
            self.keys.check(given, how="the header 'Authorization: Bearer <key>'")
        except Unauthorized as exc:
            status, body = json_error(self.shape_of(scope["path"]), exc)
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Every gRPC method but ServerLive needs `authorization: Bearer <key>` metadata."""

    def __init__(self, api_key: str | Sequence[str]) -> None:
        self.keys = ApiKeys(api_key)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization")
        try:
            self.keys.check(given, how="metadata 'authorization: Bearer <key>'")
        except Unauthorized as exc:
            return guarded(_refusing(handler, exc))
        return handler


def _refusing(handler: grpc.RpcMethodHandler, exc: Unauthorized) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that only raises `exc`."""
    async def refuse(_request: Any, _context: Any) -> Any:
        raise exc

    async def refuse_stream(_request: Any, _context: Any) -> Any:
        raise exc
        yield  # pragma: no cover - makes this an async generator, as streaming methods are

    codec = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream, **codec)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **codec)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **codec)
    return grpc.unary_unary_rpc_method_handler(refuse, **codec)
