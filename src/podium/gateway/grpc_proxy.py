"""The gateway's KServe v2 gRPC proxy (`inference.GRPCInferenceService`), bytes in, bytes out.

Model and version are read from fields 1 and 2 of the request (every model-scoped message of the
service keeps them there) without decoding the tensors; the message is re-encoded only when the
version is an alias to replace. `ModelStreamInfer` is routed by its first message and piped both
ways; a client that cancels (or leaves) cancels the upstream call, unary or stream, so the
instance cancels its work. Server-level calls (live, ready, metadata) are answered by the
gateway itself. The gateway's own errors (no such model, no instance) are `podium.errors`
rendered by the same interceptor as an instance's; an instance's status is relayed as it came.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from podium.errors import InvalidArgument, Unavailable
from podium.errors.interceptor import ErrorInterceptor
from podium.gateway.limits import DEFAULT_MAX_GRPC_MESSAGE_BYTES
from podium.gateway.routing import Endpoint, RouteTable
from podium.gateway.stats import Outcome, VersionStats
from podium.gateway.wire import read_name_version

SERVICE = "inference.GRPCInferenceService"
ROUTED = {"ModelInfer": service_pb2.ModelInferRequest,
          "ModelReady": service_pb2.ModelReadyRequest,
          "ModelMetadata": service_pb2.ModelMetadataRequest,
          "ModelConfig": service_pb2.ModelConfigRequest,
          "ModelStatistics": service_pb2.ModelStatisticsRequest}
# codes a model or its instance failed with (counted as errors by the rollout analysis)
_FAILED = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
           grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.DATA_LOSS}


def _never_sent(exc: grpc.aio.AioRpcError) -> bool:
    """True when the call failed connecting, before the instance could see the request."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in details or "connection refused" in details)


class GrpcGateway:
    """Routes gRPC calls over the same route table and stats as the HTTP proxy."""

    def __init__(self, table: RouteTable, stats: VersionStats, *, max_attempts: int = 3,
                 clock_ms: Callable[[], int] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_GRPC_MESSAGE_BYTES) -> None:
        self.table = table
        self.max_message_bytes = max_message_bytes
        self.stats = stats
        self.max_attempts = max_attempts
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}

    async def serve(self, host: str, port: int, *,
                    api_key: str | None = None) -> tuple[grpc.aio.Server, int]:
        """Start a gRPC server on host:port (0: any free port); returns it and the bound port.
        With `api_key`, every call but ServerLive needs `authorization: Bearer <key>`."""
        from podium.auth import ApiKeyInterceptor

        server = grpc.aio.server(
            interceptors=[ErrorInterceptor(), *([ApiKeyInterceptor(api_key)] if api_key else [])],
            # past it grpc answers RESOURCE_EXHAUSTED naming both sizes, before any handler
            options=[("grpc.max_receive_message_length", self.max_message_bytes),
                     ("grpc.max_send_message_length", -1)])
        server.add_generic_rpc_handlers((self._handler(),))
        bound = server.add_insecure_port(f"{host}:{port}")
        await server.start()
        return server, bound

    async def aclose(self) -> None:
        """Close every upstream channel."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    def _handler(self) -> grpc.GenericRpcHandler:
        handlers: dict[str, grpc.RpcMethodHandler] = {
            "ServerLive": grpc.unary_unary_rpc_method_handler(self._server_live),
            "ServerReady": grpc.unary_unary_rpc_method_handler(self._server_ready),
            "ServerMetadata": grpc.unary_unary_rpc_method_handler(self._server_metadata),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self._stream),
        }
        for name in ROUTED:
            handlers[name] = grpc.unary_unary_rpc_method_handler(self._unary(name))
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    # answered by the gateway ----------------------------------------------------------------

    async def _server_live(self, _request: bytes, _context: Any) -> bytes:
        return service_pb2.ServerLiveResponse(live=True).SerializeToString()

    async def _server_ready(self, _request: bytes, _context: Any) -> bytes:
        ready = any(e.can_take and e.grpc_target for e in self.table.endpoints())
        return service_pb2.ServerReadyResponse(ready=ready).SerializeToString()

    async def _server_metadata(self, _request: bytes, _context: Any) -> bytes:
        return service_pb2.ServerMetadataResponse(
            name="podium-gateway", version="1").SerializeToString()

    # routed to an instance ------------------------------------------------------------------

    def _unary(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext],
                                              Any]:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            model, version = read_name_version(ROUTED[method], request)
            tried: set[str] = set()
            last = ""
            for _ in range(self.max_attempts):
                resolved, endpoint = self._resolve(model, version, tried)
                payload = _with_version(ROUTED[method], request, version, resolved)
                started = time.perf_counter()
                endpoint.num_in_flight += 1
                try:
                    answer = await self._stub(endpoint, method)(
                        payload, metadata=_metadata(context), timeout=context.time_remaining())
                except grpc.aio.AioRpcError as exc:
                    if _never_sent(exc):
                        endpoint.healthy = False
                        tried.add(endpoint.id)
                        last = exc.details() or ""
                        continue
                    self._record(method, model, resolved, started, exc.code())
                    await context.abort(exc.code(), exc.details() or "")
                finally:
                    endpoint.num_in_flight -= 1
                self._record(method, model, resolved, started, grpc.StatusCode.OK)
                return answer
            raise Unavailable(f"no instance of {model} accepted a connection: {last}")

        return call

    async def _stream(self, requests: AsyncIterator[bytes],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        first = await anext(aiter(requests), None)
        if first is None:
            return
        model, version = read_name_version(service_pb2.ModelInferRequest, first)
        resolved, endpoint = self._resolve(model, version, set())
        cls = service_pb2.ModelInferRequest

        malformed: list[InvalidArgument] = []

        async def upstream_requests() -> AsyncIterator[bytes]:
            yield _with_version(cls, first, version, resolved)
            async for message in requests:
                try:
                    read_name_version(cls, message)
                except InvalidArgument as exc:  # end the stream here; the client hears why
                    malformed.append(exc)
                    return
                yield _with_version(cls, message, version, resolved)

        call = self._channel(endpoint).stream_stream(f"/{SERVICE}/ModelStreamInfer")(
            upstream_requests(), metadata=_metadata(context))
        endpoint.num_in_flight += 1
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            async for answer in call:
                yield answer
            if malformed:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, malformed[0].message)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            await context.abort(exc.code(), exc.details() or "")
        finally:
            # the client cancelled (or went away) while this generator was suspended in a
            # yield: end the upstream call too, so the instance cancels its generations
            call.cancel()
            endpoint.num_in_flight -= 1
            self._record("ModelStreamInfer", model, resolved, started, code)

    def _resolve(self, model: str, version: str | None, tried: set[str]) -> tuple[str, Endpoint]:
        if not model:
            raise InvalidArgument("the request names no model (field 1)", param="model_name")
        exclude = frozenset(tried | {e.id for e in self.table.endpoints() if not e.grpc_target})
        return self.table.resolve(model, version, exclude=exclude)

    def _stub(self, endpoint: Endpoint, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        key = (endpoint.grpc_target or "", method)
        stub = self._stubs.get(key)
        if stub is None:
            stub = self._stubs[key] = self._channel(endpoint).unary_unary(f"/{SERVICE}/{method}")
        return stub

    def _channel(self, endpoint: Endpoint) -> grpc.aio.Channel:
        target = endpoint.grpc_target
        assert target is not None
        if target not in self._channels:
            self._channels[target] = grpc.aio.insecure_channel(target, options=[
                ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        return self._channels[target]

    def _record(self, method: str, model: str, version: str, started: float,
                code: grpc.StatusCode) -> None:
        if method not in ("ModelInfer", "ModelStreamInfer"):
            return  # only inference counts towards a version's error rate and latency
        self.stats.record(model, version, Outcome(
            self.clock_ms(), (time.perf_counter() - started) * 1000, code not in _FAILED))


def _with_version(cls: Any, payload: bytes, asked: str | None, resolved: str) -> bytes:
    """Replace an alias (e.g. `latest`) by the version it resolved to; otherwise untouched."""
    if asked is None or asked == resolved:
        return payload
    message = cls.FromString(payload)
    field = cls.DESCRIPTOR.fields_by_number[2].name
    setattr(message, field, resolved)
    return message.SerializeToString()


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    # forward auth and custom headers; drop gRPC's own pseudo and transport headers
    return tuple((k, v) for k, v in (context.invocation_metadata() or ())
                 if not k.startswith(":") and k not in ("user-agent", "content-type", "te"))
