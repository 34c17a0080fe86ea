"""A client that leaves cancels its request's work: the raw-ASGI primitive under the instance's
frontends and the gateway.

    try:
        answer = await unless_client_leaves(receive, backend.infer(request))
    except ClientLeft:
        return  # the work was cancelled; nobody is left to answer

The work runs in the request's own task. A request still running after `WATCH_AFTER_S` gets a
watcher task that waits on `receive()` and, when the client disconnects, cancels the request's
task; that reaches vLLM's `generate` (AsyncLLM aborts a request whose generator is cancelled)
or an upstream call (aiohttp and grpc close theirs). Fast requests never get a watcher: one
sweeper task per event loop, waking every `WATCH_AFTER_S` while requests are pending, starts
the watchers of those that have run that long. A request pays for a dict entry, not for two
tasks, an `asyncio.wait` and a `receive()` (the watcher before) nor for a timer of its own
(asyncio's timer heap costs ~7 us per entry under load). A disconnect is noticed at most
2 x `WATCH_AFTER_S` late.

The request body must have been read first: the watcher drops any message but the disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

WATCH_AFTER_S = 0.1
"""How long a request's work runs before its client's connection is watched (up to twice)."""


class ClientLeft(Exception):
    """The client disconnected while its request was worked on; the work was cancelled."""


async def unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result, or `ClientLeft` once the client behind `receive` has disconnected."""
    task = asyncio.current_task()
    assert task is not None, "called outside a task"
    loop = task.get_loop()
    watch = _Watch(receive, task, loop.time())
    sweeper = _sweepers.get(loop) or _Sweeper.start(loop)
    sweeper.pending[watch] = None
    try:
        result = await work
    except asyncio.CancelledError:
        # uncancel: the request's task goes on (to answer 499, release a lease); a cancel
        # of the server's own (shutdown) still propagates
        if watch.left and task.uncancel() == 0:
            raise ClientLeft from None
        raise
    finally:
        sweeper.pending.pop(watch, None)
        if watch.watcher is not None:
            watch.watcher.cancel()
    if watch.left:  # the work swallowed the cancel and answered anyway (vLLM does)
        task.uncancel()
        raise ClientLeft
    return result


class _Watch:
    """One request whose work is running, and its watcher once started."""

    __slots__ = ("left", "receive", "since", "task", "watcher")

    def __init__(self, receive: Receive, task: asyncio.Task[Any], since: float) -> None:
        self.receive = receive
        self.task = task
        self.since = since
        self.watcher: asyncio.Task[None] | None = None
        self.left = False

    async def watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            await asyncio.sleep(0.05)  # a body chunk nobody reads: do not spin on it
        self.left = True
        self.task.cancel()


class _Sweeper:
    """Per event loop: the requests not yet watched, oldest first, and the task that starts
    the watchers of those that have run `WATCH_AFTER_S`; it ends when none is left."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[_Watch, None] = {}

    @classmethod
    def start(cls, loop: asyncio.AbstractEventLoop) -> _Sweeper:
        sweeper = _sweepers[loop] = cls(loop)
        loop.create_task(sweeper.run())
        return sweeper

    async def run(self) -> None:
        try:
            while self.pending:
                await asyncio.sleep(WATCH_AFTER_S)
                cutoff = self.loop.time() - WATCH_AFTER_S
                due = []
                for watch in self.pending:  # insertion order: oldest first
                    if watch.since > cutoff:
                        break
                    due.append(watch)
                for watch in due:
                    del self.pending[watch]
                    watch.watcher = self.loop.create_task(watch.watch())
        finally:
            if _sweepers.get(self.loop) is self:
                del _sweepers[self.loop]


_sweepers: dict[asyncio.AbstractEventLoop, _Sweeper] = {}


__all__ = ["WATCH_AFTER_S", "ClientLeft", "unless_client_leaves"]
