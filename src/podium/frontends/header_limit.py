"""Requests whose headers exceed a limit get 431 naming it, before any route runs.

uvicorn's default parser (httptools) accepts megabytes of headers; this ASGI middleware bounds
what reaches the application, rendered by `podium.errors.render` (the OpenAI error shape on
`/v1`, Triton's elsewhere). It runs once the headers are parsed, so it bounds what a route
sees, not what the parser buffers (the gateway's `http_server.bounded_head_protocol` does that).
"""

from __future__ import annotations

from typing import Any

from podium.errors import HeaderFieldsTooLarge
from podium.errors.render import instance_shape, json_error

DEFAULT_MAX_HEADER_BYTES = 64 * 1024


class HeaderLimitMiddleware:
    """431 for an HTTP request whose header names and values total more than `max_bytes`."""

    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = sum(len(name) + len(value) for name, value in scope["headers"])
        if size <= self.max_bytes:
            await self.app(scope, receive, send)
            return
        refusal = HeaderFieldsTooLarge(f"request headers of {size} bytes exceed the "
                                       f"{self.max_bytes}-byte limit (--max-header-bytes)")
        status, body = json_error(instance_shape(scope["path"]), refusal)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


__all__ = ["DEFAULT_MAX_HEADER_BYTES", "HeaderLimitMiddleware"]
