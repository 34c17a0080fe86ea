"""One grpc.aio server interceptor that turns any exception of any method into its gRPC status.

Methods raise `PodiumError`s and never abort themselves; unary and streaming methods alike end
with `podium.errors.render.grpc_status` of what they raised. An explicit `context.abort` (a
status relayed from upstream, say) passes through untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from podium.errors.render import grpc_status, problem_of, retry_after

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Renders what a method raised as its gRPC status (put it first among the interceptors)."""

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        return None if handler is None else guarded(handler)


def guarded(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler` with every exception its behaviour raises rendered as a status."""
    codec = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary), **codec)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(_unary(handler.stream_unary), **codec)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(_streaming(handler.unary_stream), **codec)
    return grpc.stream_stream_rpc_method_handler(_streaming(handler.stream_stream), **codec)


def _unary(behaviour: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result
        except Exception as exc:
            await abort(context, exc)

    return call


def _streaming(behaviour: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        result = None
        try:
            result = behaviour(request, context)
            if inspect.isawaitable(result):  # a coroutine writing with context.write
                await result
                return
            async for message in result:
                yield message
        except Exception as exc:
            await abort(context, exc)
        finally:
            if hasattr(result, "aclose"):  # a client that left ends the method's work now
                await result.aclose()

    return call


async def abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    """End the call with the status `exc` renders to (an abort already under way passes)."""
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    code, details = grpc_status(problem_of(exc))
    if (seconds := retry_after(exc)) is not None:  # overload: when to come back, as over HTTP
        context.set_trailing_metadata((("retry-after", seconds),))
    await context.abort(grpc.StatusCode[code], details)
