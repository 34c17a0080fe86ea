"""Dynamic batching: group concurrent requests into one model call, off the event loop.

Requests wait at most `max_queue_delay_s` for company. A batch is cut as soon as it reaches
`max_batch_size` (or the largest preferred size); when the delay runs out the batch takes the
longest prefix whose size is a preferred size, or everything waiting. While the model runs a
batch, the next one fills, so under load batches grow without any delay at all.

Admission: at most `max_queue` requests wait (those of the running batch aside); one more is
refused at once with `Overloaded` (429 / RESOURCE_EXHAUSTED), and a request still waiting
after `queue_timeout_s` is taken out of the queue and refused the same way. A refused request
never reaches the model: a request is refused only while it is still queued, never once its
batch has started.

Failures stay small: a model error fails the requests of its batch; a fault of the loop itself
(bookkeeping, batch forming) is logged with its traceback and fails the requests it touched,
and the loop goes on. Should the loop's task end anyway (cancelled, a BaseException), the batch
it was running fails at once and the task is restarted, at most `max_restarts` times in the
batcher's life; past that the batcher is dead: `is_alive()` turns false (the model stops being
ready, the instance's watchdog restarts the instance) and every request fails fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from podium.errors import BackendDead, BackendError, InvalidArgument, Overloaded

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE = 1024
"""Requests one model's batcher lets wait (Triton's `max_queue_size`, which is unbounded by
default)."""
DEFAULT_QUEUE_TIMEOUT_S = 30.0
"""Longest a request waits in a batcher's queue before it is refused."""

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(eq=False)  # identity: items (numpy arrays) have no truth value to compare by
class _Pending(Generic[Item, Result]):
    item: Item
    size: int
    signature: Hashable
    future: asyncio.Future[Result]
    enqueued: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class BatchingConfig:
    """Batching settings of one model (from the manifest's `dynamic_batching`)."""

    max_batch_size: int
    """Largest total batch (sum of request batch sizes) one model call takes."""
    max_queue_delay_s: float = 0.0005
    """Longest the first request of a batch waits for others."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Sizes to cut at; the largest one cuts immediately when reached."""
    max_queue: int = DEFAULT_MAX_QUEUE
    """Most requests waiting for a batch; one more is refused (Overloaded)."""
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
    """Longest a request waits for its batch to start; then it is refused (Overloaded)."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size} must be >= 1 to batch")
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s={self.max_queue_delay_s} must be >= 0")
        if self.max_queue < 1:
            raise ValueError(f"max_queue={self.max_queue} must be >= 1")
        if self.queue_timeout_s <= 0:
            raise ValueError(f"queue_timeout_s={self.queue_timeout_s} must be > 0")


class DynamicBatcher(Generic[Item, Result]):
    """Run `run_batch(items) -> results` (one result per item, same order) in a worker thread.

    `size_of(item)` is an item's batch size; only items with equal `signature_of(item)` share
    a batch (e.g. same trailing shapes, so they can be concatenated). A result that is an
    exception fails its own request only; an exception raised fails the whole batch.
    """

    def __init__(self, run_batch: Callable[[list[Item]], Sequence[Result | Exception]],
                 config: BatchingConfig, *, size_of: Callable[[Item], int] = lambda _: 1,
                 signature_of: Callable[[Item], Hashable] = lambda _: None,
                 name: str = "model", version: str = "", max_restarts: int = 3) -> None:
        self._run_batch = run_batch
        self.config = config
        self._size_of = size_of
        self._signature_of = signature_of
        self._name = name
        self._version = version
        self._key = f"{name}@{version}" if version else name
        self._pending: deque[_Pending[Item, Result]] = deque()
        self._running: list[_Pending[Item, Result]] = []
        """The batch the loop is working on (failed at once if the loop's task dies)."""
        self._arrived = asyncio.Event()
        # one worker: the model runs one batch at a time, the next one fills meanwhile
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batch-{name}")
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.max_restarts = max_restarts
        """How often a loop task that ended unexpectedly is started again before giving up."""
        self.num_restarts = 0
        self.death: str | None = None
        """Why the batcher gave up for good; None while it serves."""
        self.num_executions = 0
        self.num_rejected = 0
        """Requests refused for a full queue or an expired wait."""
        self.batch_stats: dict[int, list[int]] = {}
        """Per total batch size: [number of model calls, nanoseconds spent in them]."""

    def is_alive(self) -> bool:
        """False once the loop died more often than `max_restarts` allows."""
        return self.death is None

    async def submit(self, item: Item) -> Result:
        """Queue one request and wait for its share of a batch's result."""
        if self.death is not None:
            raise BackendDead(f"the dynamic batcher of {self._key} is dead ({self.death}); "
                              "the instance must be restarted")
        size = self._size_of(item)
        if size < 1:
            # an empty batch has nothing to score, and would reach the model as a 0-row call
            raise InvalidArgument(f"model {self._key} got an empty batch (batch size {size}); "
                                  "send at least one row")
        if len(self._pending) >= self.config.max_queue:
            self._refused("queue_full")
            raise Overloaded(f"model {self._key} is overloaded: its queue is full "
                             f"({len(self._pending)} requests waiting, max_queue="
                             f"{self.config.max_queue}); retry later, or raise "
                             "dynamic_batching.max_queue in the manifest or `podium serve "
                             "--max-queue`", param="max_queue")
        self._start()
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        pending = _Pending(item, size, self._signature_of(item), future)
        self._pending.append(pending)
        self._arrived.set()
        try:
            # shielded: a timeout must not cancel a batch's result that is on its way
            return await asyncio.wait_for(asyncio.shield(future), self.config.queue_timeout_s)
        except TimeoutError:
            if pending not in self._pending:  # its batch started: it is answered, not refused
                return await future
            self._pending.remove(pending)
            future.cancel()
            self._refused("queue_timeout")
            raise Overloaded(f"model {self._key} is overloaded: this request waited "
                             f"{self.config.queue_timeout_s:g}s in its queue without starting "
                             "(queue_timeout_ms); retry later", param="queue_timeout_ms"
                             ) from None
        except asyncio.CancelledError:  # the client left: a queued request never runs
            if pending in self._pending:
                self._pending.remove(pending)
                future.cancel()
            raise

    async def close(self) -> None:
        """Stop the loop and the worker; requests still queued fail."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._fail(self._running, RuntimeError(f"{self._name} was unloaded"))
        self._fail(list(self._pending), RuntimeError(f"{self._name} was unloaded"))
        self._pending.clear()
        self._executor.shutdown(wait=True)

    # -- the loop and its supervision ----------------------------------------------------------
    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"batcher-{self._key}")
            self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """The loop's task ended without `close`: fail what it held, then restart or give up."""
        self._task = None
        if self._closing:
            return
        error = None if task.cancelled() else task.exception()
        reason = "its task was cancelled" if error is None else f"{type(error).__name__}: {error}"
        log.error("the dynamic batcher of %s stopped: %s", self._key, reason,
                  exc_info=(type(error), error, error.__traceback__) if error else None)
        if self.num_restarts >= self.max_restarts:
            self.death = f"it stopped {self.num_restarts + 1} times, last: {reason}"
            log.error("the dynamic batcher of %s gave up after %d restarts; the model is not "
                      "ready", self._key, self.num_restarts)
            # BackendDead: whoever holds the request learns the model is gone for good
            self._fail([*self._running, *self._pending], BackendDead(
                f"the dynamic batcher of {self._key} is dead ({self.death})"))
            self._running = []
            self._pending.clear()
            return
        self._fail(self._running, BackendError(
            f"the dynamic batcher of {self._key} stopped while running this request ({reason}); "
            "retry"))
        self._running = []
        self.num_restarts += 1
        log.warning("restarting the dynamic batcher of %s (restart %d of %d)", self._key,
                    self.num_restarts, self.max_restarts)
        with contextlib.suppress(RuntimeError):  # no running loop: the next submit starts it
            self._start()

    async def _loop(self) -> None:
        while True:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
            try:
                self._running = await self._form_batch()
                if self._running:  # empty when every waiting request timed out or left
                    await self._run(self._running)
            except Exception as exc:  # a fault of the loop itself: never let it end the loop
                log.exception("the dynamic batcher of %s failed a batch", self._key)
                # requests not yet in a batch fail too: what broke may be forming one
                touched = self._running or list(self._pending)
                self._fail(touched, BackendError(
                    f"the dynamic batcher of {self._key} failed: {type(exc).__name__}: {exc}"))
                if not self._running:
                    self._pending.clear()
            self._running = []

    async def _run(self, batch: list[_Pending[Item, Result]]) -> None:
        """One model call for `batch`: its results or its error go to the batch's requests."""
        items = [p.item for p in batch]
        self._observe(batch)
        started = time.perf_counter_ns()
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run_batch, items)
            if len(results) != len(items):
                raise BackendError(f"model {self._key} returned {len(results)} results for "
                                   f"{len(items)} requests")
        except Exception as exc:  # the model's failure: its batch fails, nothing else
            self._fail(batch, exc)
            return
        total = sum(p.size for p in batch)
        self.num_executions += 1
        stats = self.batch_stats.setdefault(total, [0, 0])
        stats[0] += 1
        stats[1] += time.perf_counter_ns() - started
        for pending, result in zip(batch, results, strict=True):
            if pending.future.done():
                continue
            if isinstance(result, Exception):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)

    @staticmethod
    def _fail(batch: Sequence[_Pending[Item, Result]], error: BaseException) -> None:
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(error)

    def _refused(self, reason: str) -> None:
        from podium.metrics.server import observe_queue_refused

        self.num_rejected += 1
        observe_queue_refused(self._name, self._version, reason)

    def _observe(self, batch: list[_Pending[Item, Result]]) -> None:
        from podium.metrics.server import observe_batch, observe_queue

        now = time.monotonic()
        observe_batch(self._name, self._version, sum(p.size for p in batch))
        for pending in batch:
            observe_queue(self._name, self._version, now - pending.enqueued)

    async def _form_batch(self) -> list[_Pending[Item, Result]]:
        config = self.config
        cut_at = min(max(config.preferred_batch_sizes, default=config.max_batch_size),
                     config.max_batch_size)
        deadline = self._pending[0].enqueued + config.max_queue_delay_s
        while True:
            if not self._pending:
                return []
            candidates = self._compatible()
            if sum(p.size for p in candidates) >= cut_at:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
        if not self._pending:
            return []
        candidates = self._take_prefix(self._compatible())
        for pending in candidates:
            self._pending.remove(pending)
        return candidates

    def _compatible(self) -> list[_Pending[Item, Result]]:
        """Waiting items that fit with the oldest one, in arrival order, up to the max size."""
        first = self._pending[0]
        chosen, total = [], 0
        for pending in self._pending:
            if pending.signature != first.signature:
                continue
            if chosen and total + pending.size > self.config.max_batch_size:
                break
            chosen.append(pending)
            total += pending.size
        return chosen

    def _take_prefix(self, candidates: list[_Pending[Item, Result]]
                     ) -> list[_Pending[Item, Result]]:
        preferred = set(self.config.preferred_batch_sizes)
        if not preferred:
            return candidates
        best, total = len(candidates), 0
        prefix_ends: list[int] = []
        for index, pending in enumerate(candidates):
            total += pending.size
            if total in preferred:
                prefix_ends.append(index + 1)
        if prefix_ends:
            best = prefix_ends[-1]
        return candidates[:best]


def batch_stats(batcher: DynamicBatcher[Any, Any] | None) -> list[dict[str, Any]]:
    """Batch statistics in Triton's `batch_stats` shape (calls and time per batch size)."""
    if batcher is None:
        return []
    return [{"batch_size": size, "compute_infer": {"count": count, "ns": ns}}
            for size, (count, ns) in sorted(batcher.batch_stats.items())]
