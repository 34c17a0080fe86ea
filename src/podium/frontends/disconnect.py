"""A client that leaves cancels its request: work behind a non-streaming HTTP response stops
when the connection closes, instead of generating on for no one.

A plain `await` in a route handler runs to the end otherwise. Streaming responses are watched
by Starlette once they start (uvicorn speaks ASGI 2.3: `StreamingResponse` listens for the
disconnect and cancels the stream); what comes before their first byte is watched here. The
mechanism, and why it is cheap, is `podium.cancellation`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

from podium.cancellation import ClientLeft, unless_client_leaves

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away; logged, never read


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T | Response:
    """`work`'s result, or a 499 response once the client has disconnected (work cancelled)."""
    try:
        return await unless_client_leaves(request.receive, work)
    except ClientLeft:
        return Response(status_code=CLIENT_CLOSED)


__all__ = ["CLIENT_CLOSED", "cancel_on_disconnect"]
