"""The gateway's HTTP reverse proxy: route, admit, forward (streaming), count, retry when safe.

Where each attempt goes, and whether a failed one is sent again, is `gateway.retry`'s decision:
another instance when the connection failed before the request left, or when an instance shed
it (429) and a sibling has room, or (idempotent inference) when the connection broke after
sending; the stable version once when a canary failed it (5xx or a connection broken after
sending) and inference is idempotent. Anything else is answered as it
came, or as a 502. An instance at the gateway's in-flight bound takes nothing more
(`gateway.admission`): past it the request is answered 429 at once, never queued.

A small answer with a known length is read whole and written in one go; anything else (an SSE
stream, a chunked or large body) is relayed chunk by chunk as it arrives, never buffered.

A client that leaves closes the upstream connection, whether the gateway is waiting for the
answer (`podium.cancellation`) or relaying it: the instance sees the disconnect and cancels
the generation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from podium.backends.classic_admission import HEADER as ADMISSION_BOUND
from podium.cancellation import ClientLeft, unless_client_leaves
from podium.errors import MethodNotAllowed, UpstreamFailed
from podium.gateway import asgi, deadline
from podium.gateway.admission import Admission
from podium.gateway.asgi import Answer, Headers, Receive, Scope, Send
from podium.gateway.hold import Hold
from podium.gateway.http1 import Response as Http1Response
from podium.gateway.limits import GatewayLimits, read_body
from podium.gateway.metrics import CONTENT_TYPE as METRICS_TYPE
from podium.gateway.metrics import render as render_metrics
from podium.gateway.prefix_router import PrefixPolicy, PrefixRouter
from podium.gateway.request_route import RequestRoute, route_of
from podium.gateway.retry import Attempts, Target
from podium.gateway.upstream import NOT_SENT, SENT_FAILED, Upstream
from podium.routes.stats import Outcome, VersionStats
from podium.routes.table import Endpoint, RouteTable

# hop-by-hop headers (RFC 9110 §7.6.1) plus those the client and server recompute
_DROP_REQUEST = {b"host", b"connection", b"keep-alive", b"proxy-authenticate",
                 b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade",
                 b"content-length"}
_DROP_RESPONSE = {b"connection", b"keep-alive", b"transfer-encoding", b"trailer", b"upgrade",
                  ADMISSION_BOUND.encode()}  # the instance's word to the gateway, learned
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
WHOLE_MAX_BYTES = 1 << 20
"""Largest upstream body read whole before answering; longer ones are relayed as they come."""
_PATH_SAFE = "/:@!$&'()*+,;=~"
Upstreamed = aiohttp.ClientResponse | Http1Response
"""An instance's answer: a forwarded POST's from `gateway.http1`, the rest from aiohttp."""


def wall_ms() -> int:
    """Milliseconds since the epoch (the clock the rollout analysis windows use)."""
    return int(time.time() * 1000)


@dataclass
class _Attempt:
    """One request on one instance: counted in flight until `finish`, then recorded."""

    model: str
    version: str
    endpoint: Endpoint
    started: float
    open: bool = True
    """Still counted in flight on its instance."""


class Gateway:
    """Routes by model and version over a live `RouteTable`; records per-version outcomes.

    The gateway is itself the ASGI app (`app()` returns it).
    """

    def __init__(self, table: RouteTable | None = None, stats: VersionStats | None = None, *,
                 max_attempts: int = 3, connect_timeout_s: float = 2.0,
                 clock_ms: Callable[[], int] = wall_ms,
                 limits: GatewayLimits | None = None,
                 upstream_credential: str | None = None,
                 prefix: PrefixPolicy | None = PrefixPolicy(),
                 hold: Hold | None = None) -> None:
        self.table = table or RouteTable()
        self.hold = hold or Hold()
        """Requests held for a version at zero instances while one starts."""
        # an LLM prompt goes to the instance that most likely caches it (None: least in-flight)
        self.prefix = PrefixRouter(prefix) if prefix is not None else None
        self.limits = limits or GatewayLimits()
        self.stats = stats or VersionStats()
        self.admission = Admission(self.stats, self.limits.max_in_flight_per_instance)
        self.max_attempts = max_attempts
        self.clock_ms = clock_ms
        # no pool-wide cap: the in-flight bound caps connections per instance, and a request
        # waiting for a pooled connection would be a queue whose timeout reads as a dead instance
        self.upstream = Upstream(connect_timeout_s=connect_timeout_s, max_connections=0,
                                 credential=upstream_credential)

    def app(self) -> Gateway:
        """The ASGI app serving every path."""
        return self

    async def aclose(self) -> None:
        """Close pooled upstream connections."""
        await self.upstream.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.handle(scope, receive, send)
        elif scope["type"] == "lifespan":
            await asgi.lifespan(receive, send, on_shutdown=self.aclose)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one client request."""
        method, path = scope["method"], scope["path"]
        own = self._own_route(method, path)
        if own is not None:
            await own.send(send)
            return
        started, arrived = False, time.monotonic()

        async def tracked(message: asgi.Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            route = route_of(method, path, await read_body(scope, receive, self.limits),
                             content_encoding=_header(scope, b"content-encoding"),
                             max_body_bytes=self.limits.max_body_bytes)
            await self._forward(scope, route, receive, tracked, arrived)
        except Exception as exc:  # rendered as the instance renders it
            if started:  # a relay that broke after its headers: nothing more can be said
                raise
            await asgi.error_answer(path, exc).send(send)

    async def _forward(self, scope: Scope, route: RequestRoute, receive: Receive,
                       send: Send, arrived: float) -> None:
        headers = _request_headers(scope["headers"], inflated=route.inflated)
        expires = deadline.expires(headers, arrived)  # what the gateway spends is gone
        choose = None
        if self.prefix is not None and route.prefix is not None:
            choose = self.prefix.chooser(route.model, route.prefix, self.admission.has_room,
                                         self.stats.record_prefix_pick)
        attempts = Attempts(self.table, self.admission, self.stats, route.model, route.version,
                            max_attempts=self.max_attempts, choose=choose)
        # a version at zero instances started on demand: held until one is ready
        target: Target | None = await deadline.held(self.hold.first(
            self.table, route.model, route.version, attempts.first), expires)
        while target is not None:
            target = await self._attempt(scope, route, deadline.forwarded(headers, expires),
                                         target, attempts, receive, send)

    async def _attempt(self, scope: Scope, route: RequestRoute, headers: list[tuple[str, str]],
                       target: Target, attempts: Attempts, receive: Receive,
                       send: Send) -> Target | None:
        """Send the request to `target`; where to send it next, or None once answered."""
        route.check_served_by(target.version, target.endpoint, scope["path"])
        pinned = self.table.base_of(route.model) is not None  # a LoRA adapter: name its version
        url = _upstream_url(target.endpoint.url,
                            route.upstream_path(scope["path"], target.version, pinned=pinned),
                            scope.get("query_string", b""))
        attempt = self._start(route.model, target.version, target.endpoint)
        try:
            return await self._send(scope["method"], url, headers,
                                    route.upstream_body(target.version, pinned=pinned), attempt,
                                    attempts, target, receive, send)
        finally:  # cancelled, or failed past every count: never leave it holding the bound
            if attempt.open:
                self._release(attempt)

    async def _send(self, method: str, url: str, headers: list[tuple[str, str]], body: bytes,
                    attempt: _Attempt, attempts: Attempts, target: Target, receive: Receive,
                    send: Send) -> Target | None:
        """One attempt's exchange with the instance, counted as it ends."""
        try:
            # watched: a non-streaming answer's headers come only once it is generated
            response = await unless_client_leaves(receive, self.upstream.send(
                method, url, headers, body))
        except ClientLeft:  # aiohttp closed the connection: the instance cancels too
            self._release(attempt)  # not counted for or against the version
            return None
        except NOT_SENT as exc:  # never reached the instance: safe to try another
            self._release(attempt)
            return attempts.after_not_sent(target, str(exc))
        except SENT_FAILED as exc:  # sent, then failed: the instance may have acted
            return self._after_broken(attempt, attempts, target, exc)
        self.admission.learn(target.endpoint, response.headers.get(ADMISSION_BOUND))
        if not _is_small_whole(response):
            if not _is_refusal(response.status):
                await self._relay(response, attempt, receive, send)
                return None
            try:  # decided before the first byte is relayed: after it nothing can be resent
                retry = self._after_status(response.status, attempt, attempts, target)
            except BaseException:
                response.close()
                raise
            if retry is not None:
                response.close()
                return retry
            await self._relay(response, None, receive, send)  # counted already
            return None
        try:
            whole = await unless_client_leaves(receive, response.read())
        except ClientLeft:  # released unread below: the connection closes
            self._release(attempt)
            return None
        except SENT_FAILED as exc:
            return self._after_broken(attempt, attempts, target, exc)
        finally:
            response.release()
        # the instance is done with it: count it before the client hears back
        retry = self._after_status(response.status, attempt, attempts, target)
        if retry is None:
            await Answer(response.status, whole, _response_headers(response)).send(send)
        return retry

    def _after_status(self, status: int, attempt: _Attempt, attempts: Attempts,
                      target: Target) -> Target | None:
        """Count an answered attempt; where to resend it (a shed or a canary failure)."""
        if status == 429:  # shed by the instance: no evidence about the version
            self._release(attempt)
            return attempts.after_overloaded(target)
        if status >= 500:
            self._finish(attempt, ok=False)
            # a passed deadline has passed for every version (gRPC: DEADLINE_EXCEEDED alike)
            return attempts.after_failure(target) if status != 504 else None
        self._finish(attempt, ok=True)
        return None

    def _after_broken(self, attempt: _Attempt, attempts: Attempts, target: Target,
                      exc: Exception) -> Target:
        self._finish(attempt, ok=False)
        retry = attempts.after_broken(target)
        if retry is None:
            raise _failed_mid_request(attempt, exc) from exc
        return retry

    async def _relay(self, response: Upstreamed, attempt: _Attempt | None,
                     receive: Receive, send: Send) -> None:
        """Relay a streamed answer; `attempt` is counted at its end (None: counted already)."""
        ok = response.status < 500
        try:
            await send({"type": "http.response.start", "status": response.status,
                        "headers": _response_headers(response)})
            # a client that leaves stops the relay, which closes the upstream stream
            await _first_of(_pump(response, send), asgi.until_disconnect(receive))
        except SENT_FAILED:
            ok = False
            raise
        finally:
            response.release()  # back to the pool when read to the end, else closed
            if attempt is not None:
                self._finish(attempt, ok=ok)

    def _start(self, model: str, version: str, endpoint: Endpoint) -> _Attempt:
        endpoint.num_in_flight += 1
        return _Attempt(model, version, endpoint, time.perf_counter())

    def _release(self, attempt: _Attempt) -> None:
        """The attempt ends without an outcome for the analysis (never sent, or shed)."""
        attempt.endpoint.num_in_flight -= 1
        attempt.open = False

    def _finish(self, attempt: _Attempt, *, ok: bool) -> None:
        self._release(attempt)
        latency_ms = (time.perf_counter() - attempt.started) * 1000
        outcome = Outcome(self.clock_ms(), latency_ms, ok)
        for model, version in self.table.counted_for(attempt.model, attempt.version,
                                                     attempt.endpoint):
            self.stats.record(model, version, outcome)

    def _own_route(self, method: str, path: str) -> Answer | None:
        if method not in METHODS:
            answer = asgi.error_answer(path, MethodNotAllowed(
                f"{method} is not a method the gateway routes; use one of "
                f"{', '.join(sorted(METHODS))}"))
            return Answer(answer.status, answer.body,
                          [*answer.headers, (b"allow", ", ".join(sorted(METHODS)).encode())])
        if path in ("/health", "/health/live", "/v2/health/live"):
            return Answer.json({"status": "live"})
        if path in ("/health/ready", "/v2/health/ready"):
            ready = any(e.can_take for e in self.table.endpoints())
            return Answer.json({"ready": ready}, status=200 if ready else 503)
        if method == "GET" and path == "/metrics":
            text = render_metrics(self.table, self.stats, self.hold)
            return Answer.typed(text.encode(), METRICS_TYPE)
        if method == "GET" and path == "/v1/models":
            # a standalone deployment serves no OpenAI request: not listed
            served: dict[str, list[str]] = {}
            for name, version, endpoint in self.table.routed():
                if endpoint.frontends != "standalone" and version not in served.get(name, []):
                    served.setdefault(name, []).append(version)
            parents = {}  # a LoRA adapter is listed with its base as `parent`, as vLLM does
            for name, (base, placed) in self.table.adapters().items():
                if base in served and placed:
                    served[name], parents[name] = placed, base
            data = [{"id": name if i == 0 else f"{name}@{v}", "object": "model",
                     "owned_by": "podium",
                     **({"parent": parents[name]} if name in parents else {})}
                    for name, versions in sorted(served.items())
                    for i, v in enumerate(["", *versions]) if versions]
            return Answer.json({"object": "list", "data": data})
        return None


def _is_refusal(status: int) -> bool:
    """A shed (429) or a failure (5xx): an answer that may send the request elsewhere."""
    return status == 429 or status >= 500


def _is_small_whole(response: Upstreamed) -> bool:
    length = response.content_length
    return (length is not None and length <= WHOLE_MAX_BYTES
            and not response.headers.get("content-type", "").startswith("text/event-stream"))


async def _pump(response: Upstreamed, send: Send) -> None:
    async for chunk in response.content.iter_any():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _first_of(main: Coroutine[Any, Any, None], stop: Coroutine[Any, Any, None]) -> None:
    """Run `main` until it ends or `stop` does; `main`'s error, if any, is raised."""
    tasks = [asyncio.ensure_future(main), asyncio.ensure_future(stop)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not tasks[0].cancelled():
        tasks[0].result()


def _upstream_url(base: str, path: str, query: bytes) -> str:
    url = base + quote(path, safe=_PATH_SAFE)
    return f"{url}?{query.decode('latin-1')}" if query else url


def _request_headers(headers: Headers, *, inflated: bool) -> list[tuple[str, str]]:
    drop = _DROP_REQUEST | {b"content-encoding"} if inflated else _DROP_REQUEST
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers
            if k.lower() not in drop]


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return ""


def _response_headers(response: Upstreamed) -> Headers:
    return [(k.lower(), v) for k, v in response.raw_headers
            if k.lower() not in _DROP_RESPONSE]


def _failed_mid_request(attempt: _Attempt, exc: Exception) -> UpstreamFailed:
    return UpstreamFailed(f"{attempt.model}@{attempt.version} failed mid-request: "
                          f"{type(exc).__name__}")
