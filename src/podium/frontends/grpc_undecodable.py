"""A gRPC message that does not parse is the client's error: INVALID_ARGUMENT, not INTERNAL.

grpc answers a request its deserializer cannot read with INTERNAL ("Exception deserializing
request!"). The KServe service is registered here with deserializers that hand such bytes on
as `Undecodable`, and behaviours that answer it with INVALID_ARGUMENT naming the parse error;
on a stream, the messages before the bad one are still served.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2_grpc


class Undecodable:
    """The bytes of a request message that did not parse, and why."""

    def __init__(self, method: str, error: Exception) -> None:
        self.message = (f"the {method} request is not a valid protobuf message "
                        f"({type(error).__name__}: {error})")


def add_service(servicer: Any, server: Any) -> None:
    """Register `servicer` as `inference.GRPCInferenceService`, undecodable-message safe."""
    recorder = _Recorder()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, recorder)
    if not recorder.handlers:  # fail at boot, not with every method UNIMPLEMENTED
        raise RuntimeError("tritonclient's generated service registered no method handlers "
                           "by name; grpc_undecodable.add_service needs updating")
    handlers = {name: _tolerant(name, handler) for name, handler in recorder.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(recorder.service,
                                                                          handlers),))
    server.add_registered_method_handlers(recorder.service, handlers)


class _Recorder:
    """Stands in for a server to capture the handlers the generated code registers."""

    service = ""
    handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, generic_handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, dict(handlers)


def _tolerant(method: str, handler: Any) -> Any:
    parse = handler.request_deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, or a string field that is not UTF-8
            return Undecodable(method, exc)

    if handler.unary_unary is not None:
        return handler._replace(request_deserializer=deserialize,
                                unary_unary=_unary(handler.unary_unary))
    if handler.stream_stream is not None:
        return handler._replace(request_deserializer=deserialize,
                                stream_stream=_stream(handler.stream_stream))
    return handler


def _unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behaviour(request, context)
    return checked


def _stream(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[Any]:
        bad: list[Undecodable] = []

        async def until_bad() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    bad.append(request)  # stop reading: the stream is out of step
                    return
                yield request

        async for response in behaviour(until_bad(), context):
            yield response
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad[0].message)
    return checked


__all__ = ["Undecodable", "add_service"]
