"""The gateway's HTTP/1.1 server protocol: the edge's bounded request head
(`podium.edge.head`) plus an early answer for requests certain to be shed
(`gateway.early_shed`, answered through `podium.edge.early`), and an answer's head written
with its body.

uvicorn writes an answer's head (`http.response.start`) at once and its body with the next
message: two sends for every answer the gateway relays whole, each a loopback TCP delivery
charged to the gateway's core (~10-25 µs each on this machine). Here the head is held until
the answer's next write or the end of the event loop's turn (`_HeadHeld`), so a whole answer
goes out in one send and a streamed one's head leaves in the turn it was given, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podium.edge import head as edge_head
from podium.edge.early import early_answer_protocol
from podium.gateway.asgi import Answer, Headers

Shed = Callable[[str, str, Headers], Answer | None]
"""(method, path, headers) → the answer to give a request from its head alone, or None."""


def bounded_head_protocol(max_header_bytes: int, *, server: str = "the gateway",
                          flag: str = "--max-header-bytes",
                          shed: Shed | None = None) -> type[HttpToolsProtocol]:
    """A uvicorn `http=` protocol class refusing request heads over `max_header_bytes` (the
    431 names `server` and the `flag` that sets the limit) and answering early what `shed`
    answers."""
    bounded = edge_head.bounded_head_protocol(max_header_bytes, server=server, flag=flag)
    return _head_with_body(bounded if shed is None else early_answer_protocol(bounded, shed))


def _head_with_body(base: type[HttpToolsProtocol]) -> type[HttpToolsProtocol]:
    """A subclass of `base` whose answers go through `_HeadHeld`."""

    class HeadWithBodyProtocol(base):  # type: ignore[valid-type,misc]
        def head_complete(self) -> None:
            before = self.cycle
            super().head_complete()
            cycle = self.cycle
            if cycle is not None and cycle is not before:  # a request for the app
                cycle.transport = _HeadHeld(cycle.transport, self.loop)

    return HeadWithBodyProtocol


class _HeadHeld:
    """One answer's transport: its first write (the head) waits for the next write or the
    end of the loop's turn, whichever comes first; everything else is the transport's."""

    __slots__ = ("_first", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._held = data
            self._loop.call_soon(self._flush)
            return
        if self._held is not None:
            data, self._held = self._held + data, None
        self._transport.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
