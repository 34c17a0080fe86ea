"""A request's own deadline, whatever protocol carried it, for the backend that admits it.

HTTP (OpenAI `/v1`, KServe `/v2`): the `X-Request-Timeout` header, seconds as a decimal
number (`X-Request-Timeout: 2.5`), counted from when the instance read the request's head.
gRPC: the call's own deadline (`timeout=` in the client; `grpc-timeout` on the wire). The
frontend opens `scope(seconds)` around admission and the engine call; a backend that can
estimate how long a request takes (`backends.vllm.admission`) reads `remaining()` and refuses
at once what cannot finish in time instead of running it (429: nothing ran). A request admitted
in time whose deadline passes while it runs is stopped there: the frontend awaits its work
`within` the deadline, and a stream's chunks `until` it; the work is cancelled (vLLM aborts a
request whose generator is cancelled or closed, freeing its place in the batch) and the answer
is `DeadlineExceeded`, 504 / DEADLINE_EXCEEDED naming the header (in a stream that already
started: its last event). No header, no deadline: nothing is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from contextvars import ContextVar
from typing import TypeVar

from podium.errors import DeadlineExceeded, InvalidArgument

T = TypeVar("T")

HEADER = "x-request-timeout"
"""The HTTP header that carries a request's deadline, in seconds from its arrival."""
MAX_SECONDS = 86400.0
"""The longest deadline accepted (a day): past it the header is a 400."""

_deadline: ContextVar[float | None] = ContextVar("podium_deadline", default=None)
"""The request's deadline on `time.monotonic()`'s clock; None: the client set none."""


def parse(value: str) -> float:
    """The header's seconds, or a 400 naming the header and what it takes."""
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= MAX_SECONDS):  # NaN and inf fail too
        raise InvalidArgument(f"header X-Request-Timeout={value[:40]!r} must be a number of "
                              f"seconds above 0 and at most {MAX_SECONDS:g} (e.g. "
                              "X-Request-Timeout: 30); remove it for no deadline",
                              param="X-Request-Timeout")
    return seconds


def from_headers(headers: Mapping[str, str]) -> float | None:
    """The seconds an HTTP request's `X-Request-Timeout` gives it; None without the header."""
    value = headers.get(HEADER)
    return None if value is None else parse(value)


def from_grpc(context: object) -> float | None:
    """The seconds a gRPC call's deadline leaves it; None when the client set none."""
    time_remaining = getattr(context, "time_remaining", None)
    left = time_remaining() if time_remaining is not None else None
    return None if left is None else max(float(left), 0.0)


@contextlib.contextmanager
def scope(seconds: float | None) -> Iterator[None]:
    """Run the block with a deadline `seconds` from now (None: no deadline)."""
    token = _deadline.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def remaining() -> float | None:
    """Seconds left before the current request's deadline (negative once past); None when
    the request carries no deadline."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def at() -> float | None:
    """The current request's deadline on `time.monotonic()`'s clock; None without one (for
    work that outlives the scope, e.g. a stream's body)."""
    return _deadline.get()


def exceeded(after: str = "while it ran") -> DeadlineExceeded:
    """The 504 of a request whose deadline passed `after`."""
    return DeadlineExceeded(f"the request's deadline (X-Request-Timeout, or the gRPC call's "
                            f"deadline) passed {after}: its work was stopped; retry with a "
                            "longer deadline or a smaller request")


async def within(work: Awaitable[T]) -> T:
    """`work`'s result, or `DeadlineExceeded` once the current request's deadline passes
    (the work is then cancelled). Without a deadline: just `await work`."""
    deadline = _deadline.get()
    if deadline is None:
        return await work
    # asyncio's loop clock is time.monotonic's: the deadline carries over as it is
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            result = await work
    except TimeoutError:
        raise exceeded() from None
    if timeout.expired():  # the work swallowed the cancel and answered anyway (vLLM does)
        raise exceeded()
    return result


async def until(chunks: AsyncIterator[T], deadline: float | None) -> AsyncIterator[T]:
    """`chunks` until `deadline` (monotonic; None: to their end); past it the iterator is
    closed (which aborts the generation behind it) and `DeadlineExceeded` raised. Each chunk
    is awaited under its own timeout: a timeout spanning the `yield` would cancel whoever
    iterates."""
    iterator = aiter(chunks)
    try:
        if deadline is None:
            async for chunk in iterator:
                yield chunk
            return
        while True:
            timeout = asyncio.timeout_at(deadline)
            try:
                async with timeout:
                    chunk = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise exceeded("while it was streamed") from None
            if timeout.expired():
                raise exceeded("while it was streamed")
            yield chunk
    finally:  # closed here, not left to the collector: the engine aborts it at once
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
