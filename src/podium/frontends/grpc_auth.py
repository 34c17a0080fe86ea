"""Bearer-key authentication on gRPC: the same key as HTTP, in the `authorization` metadata.

ServerLive stays open, like /health: liveness probes carry no credentials.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

OPEN_METHODS = frozenset({"/inference.GRPCInferenceService/ServerLive"})


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Reject calls without `authorization: Bearer <key>` with UNAUTHENTICATED."""

    def __init__(self, api_key: str) -> None:
        self.expected = f"Bearer {api_key}".encode()

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        if details.method in OPEN_METHODS:
            return await continuation(details)
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(given.encode() if isinstance(given, str) else given,
                               self.expected):
            return await continuation(details)
        handler = await continuation(details)
        return _deny(handler, "missing" if not given else "wrong")


def _deny(handler: Any, reason: str) -> Any:
    message = (f"API key {reason}: send metadata 'authorization: Bearer <key>' with the key "
               "the server was started with (--api-key)")

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - abort raises

    if handler is None:
        return None
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            streaming, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            streaming, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)
