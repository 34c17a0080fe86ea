"""The gateway's HTTP reverse proxy: route, forward (streaming), count, retry only when safe.

A request is retried on another instance only when the connection failed before the request
was sent (connect error or timeout, no free pooled connection): then the upstream cannot have
seen it. Anything later is answered as it came, or as a 502, never replayed.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from podium.errors import PodiumError, Unavailable
from podium.gateway.metrics import CONTENT_TYPE as METRICS_TYPE
from podium.gateway.metrics import render as render_metrics
from podium.gateway.request_route import RequestRoute, route_of
from podium.gateway.routing import Endpoint, RouteTable
from podium.gateway.stats import Outcome, VersionStats

# hop-by-hop headers (RFC 9110 §7.6.1) plus those httpx/starlette recompute
_DROP_REQUEST = {"host", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                 "te", "trailer", "transfer-encoding", "upgrade", "content-length"}
_DROP_RESPONSE = {"connection", "keep-alive", "transfer-encoding", "trailer", "upgrade"}
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


def wall_ms() -> int:
    """Milliseconds since the epoch (the clock the rollout analysis windows use)."""
    return int(time.time() * 1000)


class Gateway:
    """Routes by model and version over a live `RouteTable`; records per-version outcomes."""

    def __init__(self, table: RouteTable | None = None, stats: VersionStats | None = None, *,
                 max_attempts: int = 3, connect_timeout_s: float = 2.0,
                 clock_ms: Callable[[], int] = wall_ms) -> None:
        self.table = table or RouteTable()
        self.stats = stats or VersionStats()
        self.max_attempts = max_attempts
        self.clock_ms = clock_ms
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256))

    async def aclose(self) -> None:
        """Close pooled upstream connections."""
        await self.client.aclose()

    async def handle(self, request: Request) -> Response:
        """Answer one client request."""
        path = request.url.path
        own = self._own_route(request.method, path)
        if own is not None:
            return own
        try:
            route = route_of(request.method, path, await request.body())
            return await self._forward(request, route)
        except PodiumError as exc:
            return _error(path, exc)

    async def _forward(self, request: Request, route: RequestRoute) -> Response:
        tried: set[str] = set()
        last: Exception | None = None
        for _ in range(self.max_attempts):
            version, endpoint = self.table.resolve(route.model, route.version,
                                                   exclude=frozenset(tried))
            upstream = self.client.build_request(
                request.method, endpoint.url + route.upstream_path(request.url.path, version),
                params=request.url.query, content=route.body, headers=_request_headers(request))
            started = time.perf_counter()
            endpoint.num_in_flight += 1
            try:
                response = await self.client.send(upstream, stream=True)
            except _NOT_SENT as exc:  # never reached the instance: safe to try another
                endpoint.num_in_flight -= 1
                endpoint.healthy = False
                tried.add(endpoint.id)
                last = exc
                continue
            except httpx.HTTPError as exc:  # sent, then failed: the instance may have acted
                endpoint.num_in_flight -= 1
                self._record(route.model, version, started, ok=False)
                return _error(request.url.path, Unavailable(
                    f"{route.model}@{version} failed mid-request: {type(exc).__name__}"),
                    status=502)
            return StreamingResponse(
                self._relay(response, route.model, version, endpoint, started),
                status_code=response.status_code, headers=_response_headers(response))
        raise Unavailable(f"no instance of {route.model} accepted a connection after "
                          f"{len(tried)} attempt(s): {last}")

    async def _relay(self, response: httpx.Response, model: str, version: str,
                     endpoint: Endpoint, started: float) -> AsyncIterator[bytes]:
        ok = response.status_code < 500
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            ok = False
            raise
        finally:
            await response.aclose()
            endpoint.num_in_flight -= 1
            self._record(model, version, started, ok=ok)

    def _record(self, model: str, version: str, started: float, *, ok: bool) -> None:
        latency_ms = (time.perf_counter() - started) * 1000
        self.stats.record(model, version, Outcome(self.clock_ms(), latency_ms, ok))

    def _own_route(self, method: str, path: str) -> Response | None:
        if path in ("/health", "/health/live", "/v2/health/live"):
            return JSONResponse({"status": "live"})
        if path in ("/health/ready", "/v2/health/ready"):
            ready = any(e.can_take for e in self.table.endpoints())
            return JSONResponse({"ready": ready}, status_code=200 if ready else 503)
        if method == "GET" and path == "/metrics":
            return Response(render_metrics(self.table, self.stats), media_type=METRICS_TYPE)
        if method == "GET" and path == "/v1/models":
            data = [{"id": name if i == 0 else f"{name}@{v}", "object": "model",
                     "owned_by": "podium"}
                    for name, versions in sorted(self.table.models().items())
                    for i, v in enumerate(["", *versions]) if versions]
            return JSONResponse({"object": "list", "data": data})
        return None

    def app(self) -> Starlette:
        """The ASGI app serving every path through `handle`."""
        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            yield
            await self.aclose()

        return Starlette(routes=[Route("/{path:path}", self.handle, methods=METHODS)],
                         lifespan=lifespan)


def _request_headers(request: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST]


def _response_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE}


def _error(path: str, exc: PodiumError, status: int | None = None) -> Response:
    status = status or exc.http_status
    if path.startswith("/v1"):
        body = {"error": {"message": exc.message, "type": exc.openai_type, "param": exc.param,
                          "code": status}}
    else:
        body = {"error": exc.message}
    return Response(json.dumps(body), status_code=status, media_type="application/json")
