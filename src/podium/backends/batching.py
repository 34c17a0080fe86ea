"""Dynamic batching: group concurrent requests into one model call, off the event loop.

Requests wait at most `max_queue_delay_s` for company. A batch is cut as soon as it reaches
`max_batch_size` (or the largest preferred size); when the delay runs out the batch takes the
longest prefix whose size is a preferred size, or everything waiting. While the model runs a
batch, the next one fills, so under load batches grow without any delay at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
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

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size} must be >= 1 to batch")
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s={self.max_queue_delay_s} must be >= 0")


class DynamicBatcher(Generic[Item, Result]):
    """Run `run_batch(items) -> results` (one result per item, same order) in a worker thread.

    `size_of(item)` is an item's batch size; only items with equal `signature_of(item)` share
    a batch (e.g. same trailing shapes, so they can be concatenated).
    """

    def __init__(self, run_batch: Callable[[list[Item]], Sequence[Result]],
                 config: BatchingConfig, *, size_of: Callable[[Item], int] = lambda _: 1,
                 signature_of: Callable[[Item], Hashable] = lambda _: None,
                 name: str = "model", version: str = "") -> None:
        self._run_batch = run_batch
        self.config = config
        self._size_of = size_of
        self._signature_of = signature_of
        self._name = name
        self._version = version
        self._pending: deque[_Pending[Item, Result]] = deque()
        self._arrived = asyncio.Event()
        # one worker: the model runs one batch at a time, the next one fills meanwhile
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batch-{name}")
        self._task: asyncio.Task[None] | None = None
        self.num_executions = 0
        self.batch_stats: dict[int, list[int]] = {}
        """Per total batch size: [number of model calls, nanoseconds spent in them]."""

    async def submit(self, item: Item) -> Result:
        """Queue one request and wait for its share of a batch's result."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(item, self._size_of(item), self._signature_of(item),
                                      future))
        self._arrived.set()
        return await future

    async def close(self) -> None:
        """Stop the loop and the worker; requests still queued fail."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._pending:
            pending = self._pending.popleft()
            if not pending.future.done():
                pending.future.set_exception(RuntimeError(f"{self._name} was unloaded"))
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
            batch = await self._form_batch()
            items = [p.item for p in batch]
            self._observe(batch)
            started = time.perf_counter_ns()
            try:
                results = await loop.run_in_executor(self._executor, self._run_batch, items)
                if len(results) != len(items):
                    raise RuntimeError(f"{self._name} returned {len(results)} results for "
                                       f"{len(items)} requests")
            except Exception as exc:  # one bad batch fails its requests, not the loop
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            total = sum(p.size for p in batch)
            self.num_executions += 1
            stats = self.batch_stats.setdefault(total, [0, 0])
            stats[0] += 1
            stats[1] += time.perf_counter_ns() - started
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)

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
