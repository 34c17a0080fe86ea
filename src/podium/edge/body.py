"""A request body read whole from ASGI, never past a byte cap and never waiting forever.

A Content-Length over the cap is refused before a byte of the body is read; a body without one
is counted as it arrives. Either way at most the cap is held in memory. With a stall bound, a
client that stops sending between two pieces is refused instead of holding the request open.
What a refusal says is the surface's (`BodyWording`): the instance, the gateway and the control
API name their own limit and flag; the edge decides only when to refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from podium.errors import InvalidArgument, PayloadTooLarge, PodiumError, RequestTimeout

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""An instance's and the gateway's default: a body the instances would refuse is refused
first."""


@dataclass(frozen=True)
class BodyWording:
    """What a refused body says; the defaults are the instance's (`podium serve`)."""

    whose: str = "the "
    """Whose limit, as it precedes "N-byte limit": "the ", "the control API's "."""
    flag: str = "--max-body-bytes"
    """The flag that sets the size limit."""
    stall_flag: str = "--body-timeout"
    """The flag that sets the stall bound."""
    declared_param: str | None = None
    """The `param` of a refusal by Content-Length."""

    def declared_too_large(self, declared: int, max_bytes: int) -> PodiumError:
        """A Content-Length past the cap."""
        return PayloadTooLarge(f"request body of {declared} bytes exceeds {self.whose}"
                               f"{max_bytes}-byte limit ({self.flag})",
                               param=self.declared_param)

    def sent_too_large(self, max_bytes: int) -> PodiumError:
        """More than the cap arrived."""
        return PayloadTooLarge(f"request body exceeds {self.whose}{max_bytes}-byte limit "
                               f"({self.flag})")

    def bad_length(self, value: str) -> PodiumError | None:
        """A Content-Length that is not a byte count; None: ignore it (uvicorn's parser
        refuses such a request before it reaches an app)."""
        return None

    def stalled(self, size: int, declared: int | None, stall_s: float) -> PodiumError:
        """Nothing arrived for `stall_s` seconds after `size` bytes."""
        of = f"the declared {declared}" if declared is not None else "its"
        return RequestTimeout(f"the request body stopped arriving: {size} of {of} bytes came, "
                              f"then nothing for {stall_s:g} s ({self.stall_flag})")

    def left(self, size: int, declared: int | None) -> PodiumError | None:
        """The client disconnected after `size` bytes; None: read what came as the body."""
        of = f" of {declared}" if declared is not None else ""
        return InvalidArgument(f"the client closed the connection after {size}{of} bytes of "
                               "the request body")


INSTANCE = BodyWording()


def content_length(headers: Iterable[tuple[bytes, bytes]], wording: BodyWording = INSTANCE
                   ) -> int | None:
    """The declared body size among raw ASGI `headers`, None when absent (or, unless
    `wording.bad_length` refuses it, when it is not a byte count)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            text = value.decode("latin-1")
            if text.strip().isascii() and text.strip().isdigit():
                return int(text)
            refusal = wording.bad_length(text)
            if refusal is not None:
                raise refusal
            return None
    return None


async def read_request_body(scope: MutableMapping[str, Any], receive: Receive, max_bytes: int,
                            *, stall_s: float | None = None,
                            wording: BodyWording = INSTANCE) -> bytes:
    """The whole body of the HTTP request `scope`, as `read_body` reads it, its declared size
    from the Content-Length header."""
    declared = content_length(scope["headers"], wording)
    return await read_body(receive, max_bytes, declared=declared, stall_s=stall_s,
                           wording=wording)


async def read_body(receive: Receive, max_bytes: int, *, declared: int | None = None,
                    stall_s: float | None = None, wording: BodyWording = INSTANCE) -> bytes:
    """The whole body from `receive`: refused past `max_bytes` (declared or sent) and, with
    `stall_s`, when nothing arrives for that long between two pieces."""
    if declared is not None and declared > max_bytes:
        raise wording.declared_too_large(declared, max_bytes)
    message = await receive()  # most bodies come whole in the first message: no timer
    first = _body_of(message, 0, declared, wording)
    if first is None:
        return b""
    if not message.get("more_body", False) or len(first) > max_bytes:
        _check_size(len(first), max_bytes, wording)
        return first
    chunks, size = [first], len(first)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(stall_s) as timer:
            while message.get("more_body", False):
                message = await receive()
                chunk = _body_of(message, size, declared, wording)
                if chunk is None:
                    break
                size += len(chunk)
                _check_size(size, max_bytes, wording)
                chunks.append(chunk)
                if stall_s is not None:  # a timeout between pieces, not for the whole body
                    timer.reschedule(loop.time() + stall_s)
    except TimeoutError:
        assert stall_s is not None
        raise wording.stalled(size, declared, stall_s) from None
    return b"".join(chunks)


def _body_of(message: Message, size: int, declared: int | None,
             wording: BodyWording) -> bytes | None:
    if message["type"] != "http.request":  # the client left
        refusal = wording.left(size, declared)
        if refusal is not None:
            raise refusal
        return None
    return message.get("body", b"")


def _check_size(size: int, max_bytes: int, wording: BodyWording) -> None:
    if size > max_bytes:
        raise wording.sent_too_large(max_bytes)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands out `body` (already read) first, then what `receive` gives."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: only the client's disconnect is left

    return replayed
