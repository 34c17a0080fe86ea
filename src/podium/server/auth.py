"""Bearer-key authentication for every route but liveness, compared in constant time."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from podium.server.errors import error_response

LIVENESS_PATHS = frozenset({"/health", "/health/live", "/v2/health/live"})


class ApiKeyMiddleware:
    """Reject requests without `Authorization: Bearer <key>` (401 in the route's error shape)."""

    def __init__(self, app: ASGIApp, *, api_key: str, metrics_open: bool = False) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = LIVENESS_PATHS | ({"/metrics"} if metrics_open else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        from podium.errors import Unauthorized

        reason = "missing" if not given else "wrong"
        response = error_response(
            scope["path"],
            Unauthorized(f"API key {reason}: send the header 'Authorization: Bearer <key>' "
                         "with the key the server was started with (--api-key)"),
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
