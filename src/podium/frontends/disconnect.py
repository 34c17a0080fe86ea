"""A client that leaves cancels its request: work behind a non-streaming HTTP response stops
when the connection closes, instead of generating on for no one.

Streaming responses need nothing more (Starlette cancels them on disconnect); a plain
`await` in a route handler runs to the end otherwise. Cancelling the task reaches vLLM's
`generate`, which aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away; logged, never read


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T | Response:
    """`work`'s result, or a 499 response once the client has disconnected (work cancelled)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=CLIENT_CLOSED)
    finally:
        watcher.cancel()
        if not task.done():  # the handler itself was cancelled
            task.cancel()


async def _disconnected(request: Request) -> None:
    while True:
        message: Any = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # a body chunk nobody reads: do not spin on it


__all__ = ["CLIENT_CLOSED", "cancel_on_disconnect"]
