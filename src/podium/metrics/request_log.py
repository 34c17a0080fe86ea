"""Per-request structured logs and X-Request-Id, for HTTP (middleware) and gRPC (helpers).

The middleware opens a `RequestContext` for each HTTP request; frontends fill in what only
they know (model, version, protocol, token counts) with `annotate(...)`, and the middleware
writes one line when the last byte is sent: JSON with `--log-format json`, a short text line
otherwise. When a frontend annotated a protocol, the middleware also records the request in
`podium:requests` / `podium:request_duration_seconds` (endpoint = the matched route template),
so HTTP frontends need not call `observe_request` themselves. The gRPC frontend uses
`podium.metrics.grpc_log.track_grpc` instead.
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
import time
import uuid
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from podium.errors.render import bind_request_id, unbind_request_id

LogFormat = Literal["text", "json"]
HEADER = "x-request-id"
LOGGER_NAME = "podium.request"

# Client ids are echoed into logs and headers: accept only short, printable, quote-free tokens
# so a client cannot forge log lines or split headers.
_VALID_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")

logger = logging.getLogger(LOGGER_NAME)


@dataclass
class RequestContext:
    """What is known about one request; mutable so frontends can add to it as they learn."""

    request_id: str
    method: str = ""
    path: str = ""
    protocol: str | None = None
    endpoint: str | None = None
    model: str | None = None
    version: str | None = None
    status: int | str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    user: str | None = None
    """The end user the client named (OpenAI's `user`), for per-user accounting."""
    started: float = field(default_factory=time.perf_counter, repr=False)
    latency_s: float | None = None
    traceparent: str | None = field(default=None, repr=False)
    """The caller's W3C trace context (`traceparent` header or metadata), for pipelines."""


_current: ContextVar[RequestContext | None] = ContextVar("podium_request", default=None)


def current() -> RequestContext | None:
    """The context of the request being served by this task, if any."""
    return _current.get()


def annotate(**fields: Any) -> None:
    """Add what the frontend learned (model, version, protocol, endpoint, token counts)."""
    ctx = _current.get()
    if ctx is None:
        return
    if fields.get("protocol") is not None:
        from podium.metrics.server import PROTOCOLS

        if fields["protocol"] not in PROTOCOLS:
            raise ValueError(f"protocol={fields['protocol']!r} is not one of {PROTOCOLS}")
    for name, value in fields.items():
        if not hasattr(ctx, name) or name in ("request_id", "started"):
            raise TypeError(f"annotate() got unknown field {name!r}")
        setattr(ctx, name, value)


def request_id_from(incoming: str | None) -> str:
    """The client's id when it is a safe token, else a fresh one."""
    if incoming and _VALID_ID.match(incoming):
        return incoming
    # a version-4 UUID from `random`: `uuid4` reads the kernel's urandom per call (a syscall,
    # ~4% of the event loop per pipeline request at c=32); a request id is no secret
    return uuid.UUID(int=random.getrandbits(128), version=4).hex


def configure(log_format: LogFormat, stream: IO[str] | None = None) -> None:
    """Send request lines to `stream` (stderr) in `log_format`; idempotent."""
    if log_format not in ("text", "json"):
        raise ValueError(f"log_format={log_format!r} is not 'text' or 'json'")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # one line per request, not a second copy from the root logger
    _format["value"] = log_format


_format: dict[str, LogFormat] = {"value": "text"}


def format_line(ctx: RequestContext, log_format: LogFormat) -> str:
    """One log line for a finished request."""
    record = asdict(ctx)
    del record["started"], record["traceparent"]
    if record["user"] is None:
        del record["user"]  # the line's shape is unchanged for requests without one
    if log_format == "json":
        # The same envelope as the instance's other JSON log lines (podium.server.logs), so one
        # log pipeline parses both.
        envelope = {
            "ts": round(time.time(), 3),
            "level": "info",
            "logger": LOGGER_NAME,
            "message": f"{ctx.method} {ctx.path} {ctx.status}",
        }
        if ctx.latency_s is not None:
            record["latency_s"] = round(ctx.latency_s, 6)
        return json.dumps({**envelope, **record}, separators=(",", ":"), default=str)
    latency = f"{ctx.latency_s * 1000:.1f}ms" if ctx.latency_s is not None else "-"
    model = f"{ctx.model}@{ctx.version}" if ctx.model else "-"
    tokens = (f"{ctx.prompt_tokens}+{ctx.completion_tokens}tok"
              if ctx.prompt_tokens is not None or ctx.completion_tokens is not None else "-")
    # the user is the client's own text: quoted and escaped, so it cannot forge a line
    user = f" user={json.dumps(ctx.user)}" if ctx.user is not None else ""
    return (
        f"{ctx.request_id} {ctx.method} {ctx.path} {ctx.status} {latency} "
        f"{ctx.protocol or '-'} {model} {tokens}{user}"
    )


def log_request(ctx: RequestContext) -> None:
    """Write the line for a finished request (sets its latency if the caller did not)."""
    if ctx.latency_s is None:
        ctx.latency_s = time.perf_counter() - ctx.started
    if logger.isEnabledFor(logging.INFO):
        logger.info(format_line(ctx, _format["value"]))


class RequestIdMiddleware:
    """ASGI middleware: X-Request-Id in and out, a RequestContext per request, one log line.

    Pure ASGI rather than BaseHTTPMiddleware, so streamed responses are not buffered and the
    line is written after the last chunk, with the final token counts.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, HEADER.encode())
        ctx = RequestContext(
            request_id=request_id_from(incoming), method=scope["method"], path=scope["path"],
            traceparent=_header(scope, b"traceparent"))
        token = _current.set(ctx)
        bound = bind_request_id(ctx.request_id)  # a 500's message names this id
        id_header = (HEADER.encode(), ctx.request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                ctx.status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), id_header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            if ctx.status is None:
                ctx.status = 500
            raise
        finally:
            _current.reset(token)
            unbind_request_id(bound)
            log_request(ctx)
            if ctx.protocol is not None:
                _observe(ctx, scope)


def _observe(ctx: RequestContext, scope: Scope) -> None:
    from podium.metrics import server

    route = scope.get("route")
    # A route template, never the raw path: raw paths would make one series per URL.
    endpoint = ctx.endpoint or getattr(route, "path", None) or "unmatched"
    server.observe_request(
        ctx.protocol,  # type: ignore[arg-type]
        endpoint,
        ctx.model or "",
        ctx.version or "",
        ctx.status if ctx.status is not None else 500,
        ctx.latency_s or 0.0,
    )


def install(app: Any, log_format: LogFormat = "text", stream: IO[str] | None = None) -> None:
    """Add X-Request-Id handling and per-request logs to a FastAPI/Starlette app."""
    configure(log_format, stream)
    app.add_middleware(RequestIdMiddleware)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
