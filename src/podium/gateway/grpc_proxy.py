"""The gateway's KServe v2 gRPC proxy (`inference.GRPCInferenceService`), bytes in, bytes out.

Model and version are read from fields 1 and 2 of the request (every model-scoped message of the
service keeps them there) without decoding the tensors; the message is re-encoded only when the
version is an alias to replace. `ModelStreamInfer` is routed by its first message and piped both
ways; a client that cancels (or leaves) cancels the upstream call, unary or stream, so the
instance cancels its work. Where each attempt goes is `gateway.retry`'s decision, as for HTTP:
an instance at the gateway's in-flight bound takes nothing more (RESOURCE_EXHAUSTED at once),
and a unary call a canary failed goes once to the stable version; a stream is never sent again
(its messages went to the first instance as they came). Server-level calls (live, ready,
metadata) are answered by the gateway itself. The gateway's own errors (no such model, no
instance) are `podium.errors` rendered by the same interceptor as an instance's; an instance's
status is relayed as it came.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from podium.auth_keys import Access
from podium.errors import InvalidArgument
from podium.errors.interceptor import ErrorInterceptor
from podium.gateway import deadline
from podium.gateway.admission import BY_INSTANCE, Admission
from podium.gateway.hold import Hold
from podium.gateway.limits import DEFAULT_MAX_GRPC_MESSAGE_BYTES, DEFAULT_MAX_IN_FLIGHT_PER_INSTANCE
from podium.gateway.retry import Attempts, Target
from podium.gateway.wire import read_name_version
from podium.routes.stats import Outcome, VersionStats
from podium.routes.table import Endpoint, RouteTable

SERVICE = "inference.GRPCInferenceService"
ROUTED = {"ModelInfer": service_pb2.ModelInferRequest,
          "ModelReady": service_pb2.ModelReadyRequest,
          "ModelMetadata": service_pb2.ModelMetadataRequest,
          "ModelConfig": service_pb2.ModelConfigRequest,
          "ModelStatistics": service_pb2.ModelStatisticsRequest}
# codes a model or its instance failed with (counted as errors by the rollout analysis)
_FAILED = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
           grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.DATA_LOSS}
# of those, the ones another version may still answer in time (a passed deadline has passed)
_RESENDABLE = _FAILED - {grpc.StatusCode.DEADLINE_EXCEEDED}


def _shed(exc: grpc.aio.AioRpcError) -> bool:
    """True when the instance refused the call for overload (not for a too-large message)."""
    return (exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "larger than max" not in (exc.details() or ""))


def _never_sent(exc: grpc.aio.AioRpcError) -> bool:
    """True when the call failed connecting, before the instance could see the request."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in details or "connection refused" in details)


class GrpcGateway:
    """Routes gRPC calls over the same route table and stats as the HTTP proxy."""

    def __init__(self, table: RouteTable, stats: VersionStats, *, max_attempts: int = 3,
                 clock_ms: Callable[[], int] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_GRPC_MESSAGE_BYTES,
                 upstream_credential: str | None = None,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT_PER_INSTANCE,
                 hold: Hold | None = None) -> None:
        self.table = table
        self.hold = hold or Hold()
        """Requests held for a version at zero instances (shared with the HTTP proxy)."""
        # sent to instances in place of the client's own authorization (a gateway key)
        self._authorization = f"Bearer {upstream_credential}" if upstream_credential else None
        self.max_message_bytes = max_message_bytes
        self.stats = stats
        # the bound counts HTTP and gRPC together: both proxies share the endpoints' counts
        self.admission = Admission(stats, max_in_flight)
        self.max_attempts = max_attempts
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}

    async def serve(self, host: str, port: int, *, api_key: str | None = None,
                    access: Access | None = None,
                    reuse_port: bool = True) -> tuple[grpc.aio.Server, int]:
        """Start a gRPC server on host:port (0: any free port); returns it and the bound port.
        With `api_key` (every role) or `access` (keys per role), every call but ServerLive
        needs `authorization: Bearer <key>`; `reuse_port` (grpc's default) lets several
        gateways share the port."""
        from podium.auth import grpc_interceptors

        server = grpc.aio.server(
            interceptors=[ErrorInterceptor(), *grpc_interceptors(
                Access.single(api_key) if api_key else access)],
            # past it grpc answers RESOURCE_EXHAUSTED naming both sizes, before any handler
            options=[("grpc.max_receive_message_length", self.max_message_bytes),
                     ("grpc.max_send_message_length", -1),
                     ("grpc.so_reuseport", int(reuse_port))])
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
            attempts = self._attempts(model, version)
            expires = deadline.grpc_expires(context)
            target = await deadline.held(self.hold.first(self.table, model, version,
                                                         attempts.first), expires)
            pinned = self.table.base_of(model) is not None
            while True:
                payload = _with_version(ROUTED[method], request, version, target.version,
                                        pinned=pinned)
                started = time.perf_counter()
                endpoint = target.endpoint
                # what the gateway spent is gone: the instance gets what is left, or nothing
                left = deadline.remaining(expires)
                endpoint.num_in_flight += 1
                try:
                    answer = await self._stub(endpoint, method)(
                        payload, metadata=self._metadata(context), timeout=left)
                except grpc.aio.AioRpcError as exc:
                    retry = self._after_error(method, model, target, attempts, started, exc)
                    if retry is None:
                        await context.abort(exc.code(), exc.details() or "")
                    target = retry
                    continue
                finally:
                    endpoint.num_in_flight -= 1
                self._record(method, model, target.version, endpoint, started,
                             grpc.StatusCode.OK)
                return answer

        return call

    async def _stream(self, requests: AsyncIterator[bytes],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        first = await anext(aiter(requests), None)
        if first is None:
            return
        model, version = read_name_version(service_pb2.ModelInferRequest, first)
        expires = deadline.grpc_expires(context)
        target = await deadline.held(self.hold.first(self.table, model, version,
                                                     self._attempts(model, version).first),
                                     expires)
        left = deadline.remaining(expires)
        resolved, endpoint = target.version, target.endpoint
        cls = service_pb2.ModelInferRequest
        pinned = self.table.base_of(model) is not None

        malformed: list[InvalidArgument] = []

        async def upstream_requests() -> AsyncIterator[bytes]:
            yield _with_version(cls, first, version, resolved, pinned=pinned)
            async for message in requests:
                try:
                    read_name_version(cls, message)
                except InvalidArgument as exc:  # end the stream here; the client hears why
                    malformed.append(exc)
                    return
                yield _with_version(cls, message, version, resolved, pinned=pinned)

        call = self._channel(endpoint).stream_stream(f"/{SERVICE}/ModelStreamInfer")(
            upstream_requests(), metadata=self._metadata(context), timeout=left)
        endpoint.num_in_flight += 1
        started = time.perf_counter()
        code: grpc.StatusCode | None = grpc.StatusCode.OK
        try:
            async for answer in call:
                yield answer
            if malformed:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, malformed[0].message)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if _shed(exc):  # the instance's overload refusal: no evidence about the version
                self.stats.record_shed(model, resolved, BY_INSTANCE)
                code = None
            await context.abort(exc.code(), exc.details() or "")
        finally:
            # the client cancelled (or went away) while this generator was suspended in a
            # yield: end the upstream call too, so the instance cancels its generations
            call.cancel()
            endpoint.num_in_flight -= 1
            if code is not None:
                self._record("ModelStreamInfer", model, resolved, endpoint, started, code)

    def _metadata(self, context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
        return _metadata(context, self._authorization)

    def _attempts(self, model: str, version: str | None) -> Attempts:
        if not model:
            raise InvalidArgument("the request names no model (field 1)", param="model_name")
        http_only = frozenset(e.id for e in self.table.endpoints() if not e.grpc_target)
        return Attempts(self.table, self.admission, self.stats, model, version,
                        max_attempts=self.max_attempts, exclude=http_only)

    def _after_error(self, method: str, model: str, target: Target, attempts: Attempts,
                     started: float, exc: grpc.aio.AioRpcError) -> Target | None:
        """Count a failed call; where to resend it (None: relay its status)."""
        if _never_sent(exc):
            return attempts.after_not_sent(target, exc.details() or "")
        if _shed(exc):  # shed by the instance: no evidence about the version
            return attempts.after_overloaded(target)
        self._record(method, model, target.version, target.endpoint, started, exc.code())
        return attempts.after_failure(target) if exc.code() in _RESENDABLE else None

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

    def _record(self, method: str, model: str, version: str, endpoint: Endpoint,
                started: float, code: grpc.StatusCode) -> None:
        if method not in ("ModelInfer", "ModelStreamInfer"):
            return  # only inference counts towards a version's error rate and latency
        outcome = Outcome(self.clock_ms(), (time.perf_counter() - started) * 1000,
                          code not in _FAILED)
        for counted, counted_version in self.table.counted_for(model, version, endpoint):
            self.stats.record(counted, counted_version, outcome)


def _with_version(cls: Any, payload: bytes, asked: str | None, resolved: str, *,
                  pinned: bool = False) -> bytes:
    """Replace an alias (e.g. `latest`) by the version it resolved to; otherwise untouched.
    `pinned` (a LoRA adapter, whose base instance serves all its versions) always names it."""
    if not pinned and (asked is None or asked == resolved):
        return payload
    message = cls.FromString(payload)
    field = cls.DESCRIPTOR.fields_by_number[2].name
    setattr(message, field, resolved)
    return message.SerializeToString()


def _metadata(context: grpc.aio.ServicerContext,
              authorization: str | None = None) -> tuple[tuple[str, str | bytes], ...]:
    # forward custom headers (and the client's auth when there is no credential of our own);
    # drop gRPC's own pseudo and transport headers
    dropped = ("user-agent", "content-type", "te", *(("authorization",) if authorization else ()))
    forwarded = tuple((k, v) for k, v in (context.invocation_metadata() or ())
                      if not k.startswith(":") and k not in dropped)
    return (*forwarded, ("authorization", authorization)) if authorization else forwarded
