"""A request's own deadline through the gateway: what the gateway spends is subtracted.

The client's `X-Request-Timeout` (seconds) counts from when the gateway reads the request
(its gRPC deadline likewise). Before each attempt the gateway forwards what is left of it, so
the instance's admission estimate and its stop at the deadline (`backends.deadline`) see the
time the gateway spent (routing, a retry, waiting for an instance started from zero) as gone.
When nothing is left (less than `MIN_LEFT_S`) the request is answered 504 / DEADLINE_EXCEEDED
naming the header, and never sent; a wait for a cold start ends at the deadline the same way.
A bad header is the instance's 400 naming it, answered by the gateway.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from podium.backends import deadline as request_deadline
from podium.errors import DeadlineExceeded

T = TypeVar("T")
MIN_LEFT_S = 0.001
"""Less than this left: nothing an instance could do in time; answered 504 at once."""


def expires(headers: list[tuple[str, str]], arrived: float) -> float | None:
    """When the request's deadline passes (monotonic), from its header; None without one; a
    400 naming the header when it is bad."""
    for name, value in headers:
        if name.lower() == request_deadline.HEADER:
            return arrived + request_deadline.parse(value)
    return None


def forwarded(headers: list[tuple[str, str]], expires_at: float | None
              ) -> list[tuple[str, str]]:
    """`headers` with what is left of the deadline in place of the client's value; a 504 when
    nothing is left."""
    left = remaining(expires_at)
    if left is None:
        return headers
    header = request_deadline.HEADER
    return [*((k, v) for k, v in headers if k.lower() != header), (header, f"{left:.6f}")]


def remaining(expires_at: float | None) -> float | None:
    """Seconds left for an attempt about to be sent (None without a deadline); a 504 when
    fewer than `MIN_LEFT_S`."""
    if expires_at is None:
        return None
    return left_or_exceeded(expires_at, "in the gateway, before it reached an instance")


def left_or_exceeded(expires_at: float, where: str) -> float:
    """Seconds left before `expires_at`; `DeadlineExceeded` when fewer than `MIN_LEFT_S`."""
    left = expires_at - time.monotonic()
    if left < MIN_LEFT_S:
        raise DeadlineExceeded(f"the request's deadline (X-Request-Timeout, or the gRPC "
                               f"call's deadline) passed {where}; retry with a longer "
                               "deadline")
    return left


async def held(wait: Awaitable[T], expires_at: float | None) -> T:
    """`wait` (for an instance started from zero) until the deadline; then a 504."""
    if expires_at is None:
        return await wait
    try:
        async with asyncio.timeout_at(expires_at):
            return await wait
    except TimeoutError:
        left_or_exceeded(expires_at, "while the gateway waited for an instance to start")
        raise


def grpc_expires(context: Any) -> float | None:
    """When a gRPC call's deadline passes (monotonic); None without one."""
    left = request_deadline.from_grpc(context)
    return None if left is None else time.monotonic() + left
