"""Requests whose headers exceed a limit get 431 naming it, before any route runs.

uvicorn's default parser (httptools) accepts megabytes of headers; this ASGI middleware bounds
what reaches the application (the OpenAI error shape on `/v1`, Triton's elsewhere).
"""

from __future__ import annotations

import json
from typing import Any

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
        message = (f"request headers of {size} bytes exceed the {self.max_bytes}-byte limit "
                   "(--max-header-bytes)")
        error: Any = message
        if scope["path"].startswith("/v1/"):
            error = {"message": message, "type": "invalid_request_error", "param": None,
                     "code": 431}
        body = json.dumps({"error": error}).encode()
        await send({"type": "http.response.start", "status": 431,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


__all__ = ["DEFAULT_MAX_HEADER_BYTES", "HeaderLimitMiddleware"]
