"""API keys for the instance, the gateway and the control plane, over HTTP and gRPC.

A caller sends `Authorization: Bearer <key>` (HTTP header or gRPC metadata). Each route has a
role (`auth_keys`): liveness is open (probes carry no credentials), the model repository and
/metrics are `admin`, everything else is `inference`; the control-plane API is all `admin`.
Any key of the route's role is accepted, each compared in constant time. A refusal is 401 /
UNAUTHENTICATED, rendered like every other error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from podium.auth_keys import ADMIN, INFERENCE, Access, ApiKeys, KeyConfig
from podium.errors import Unauthorized
from podium.errors.interceptor import guarded
from podium.errors.render import Shape, instance_shape, json_error

LIVENESS_PATHS = frozenset({"/health", "/health/live", "/v2/health/live"})
OPEN_METHODS = frozenset({"/inference.GRPCInferenceService/ServerLive"})
ADMIN_METHODS = frozenset(f"/inference.GRPCInferenceService/{name}" for name in (
    "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"))
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
RoleOf = Callable[[str], str | None]


def instance_role(path: str) -> str | None:
    """The role an instance (or gateway) route needs; None for liveness."""
    if path in LIVENESS_PATHS:
        return None
    if path == "/metrics" or path == "/v2/repository" or path.startswith("/v2/repository/"):
        return ADMIN
    return INFERENCE


def admin_role(path: str) -> str | None:
    """The control-plane API: every route but /health and the console's files (/console/...:
    a page and its script, no data; the page sends the key for what it reads) is
    administration."""
    if path == "/health" or path == "/console" or path.startswith("/console/"):
        return None
    return ADMIN


def grpc_role(method: str) -> str | None:
    """The role a KServe gRPC method needs; None for ServerLive."""
    if method in OPEN_METHODS:
        return None
    return ADMIN if method in ADMIN_METHODS else INFERENCE


def _access(api_key: str | Sequence[str] | None, access: Access | None) -> Access:
    if access is not None:
        return access
    if not api_key:
        raise ValueError("give api_key or access")
    return Access.single(api_key)


class ApiKeyMiddleware:
    """ASGI middleware: every HTTP route needs a key of its role (`role_of`); liveness, and
    /metrics when `metrics_open`, need none."""

    def __init__(self, app: ASGIApp, *, api_key: str | Sequence[str] | None = None,
                 access: Access | None = None, role_of: RoleOf = instance_role,
                 metrics_open: bool = False,
                 shape_of: Callable[[str], Shape] = instance_shape) -> None:
        self.app = app
        self.access = _access(api_key, access)
        self.role_of = role_of
        self.metrics_open = metrics_open
        self.shape_of = shape_of

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        role = self.role_of(path) if scope["type"] == "http" else None
        if role is None or (self.metrics_open and path == "/metrics"):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        try:
            self.access.check(role, given, how="the header 'Authorization: Bearer <key>'")
        except Unauthorized as exc:
            status, body = json_error(self.shape_of(path), exc)
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Every gRPC method but ServerLive needs `authorization: Bearer <key>` metadata of its
    role (repository methods: admin; the rest: inference)."""

    def __init__(self, api_key: str | Sequence[str] | None = None, *,
                 access: Access | None = None) -> None:
        self.access = _access(api_key, access)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        role = grpc_role(details.method)
        if handler is None or role is None:
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization")
        try:
            self.access.check(role, given, how="metadata 'authorization: Bearer <key>'")
        except Unauthorized as exc:
            return guarded(_refusing(handler, exc))
        return handler


def grpc_interceptors(access: Access | None) -> list[grpc.aio.ServerInterceptor]:
    """The key check for a gRPC server, or nothing when `access` guards no role."""
    return [ApiKeyInterceptor(access=access)] if access is not None and access.guarded else []


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


__all__ = ["ADMIN", "INFERENCE", "Access", "ApiKeyInterceptor", "ApiKeyMiddleware", "ApiKeys",
           "KeyConfig", "admin_role", "grpc_interceptors", "grpc_role", "instance_role"]
