"""The dynamic batcher's admission: a bounded queue and a queue timeout, each refusing with
Overloaded at once and never running the refused request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from podium.backends.batching import BatchingConfig, DynamicBatcher
from podium.errors import Overloaded
from podium.metrics.server import REGISTRY
from tests.support.polling import async_eventually


def num_refused(model: str, reason: str) -> float:
    """`podium:queue_refused_total` for one model and reason (0 before any)."""
    return REGISTRY.get_sample_value("podium:queue_refused_total",
                                     {"model": model, "version": "1", "reason": reason}) or 0


class Gate:
    """A model whose calls block until `release` (so the queue behind it fills)."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.opened = threading.Event()
        self.started = threading.Event()

    def __call__(self, items: list[int]) -> list[int]:
        self.seen += items
        self.started.set()
        self.opened.wait(10)
        return [2 * i for i in items]


async def _wait_started(model: Gate) -> None:
    assert await async_eventually(model.started.is_set)


def test_a_full_queue_refuses_at_once_and_the_refused_request_never_runs() -> None:
    model = Gate()

    async def go() -> list:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=1, max_queue=2),
                                 name="full-queue", version="1")
        try:
            running = asyncio.ensure_future(batcher.submit(0))  # occupies the model
            await _wait_started(model)
            queued = [asyncio.ensure_future(batcher.submit(i)) for i in (1, 2)]
            assert await async_eventually(lambda: len(batcher._pending) == 2)
            with pytest.raises(Overloaded, match=r"queue is full \(2 requests waiting, "
                                                 r"max_queue=2\)") as refused:
                await asyncio.wait_for(batcher.submit(3), 5)  # queued, it would wait the gate
            # at once: refused while the test still holds the model and the two ahead wait
            assert not running.done() and not any(q.done() for q in queued)
            assert refused.value.retry_after_s >= 1
            model.opened.set()
            results = await asyncio.gather(running, *queued)
            assert batcher.num_rejected == 1
            assert num_refused("full-queue", "queue_full") == 1  # in /metrics, with its reason
            # the queue drained: a new request is served again
            return [*results, await batcher.submit(4)]
        finally:
            model.opened.set()
            await batcher.close()

    assert asyncio.run(go()) == [0, 2, 4, 8]
    assert 3 not in model.seen


def test_a_request_waiting_past_the_queue_timeout_is_refused_and_never_runs() -> None:
    model = Gate()

    async def go() -> list:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=1,
                                                       queue_timeout_s=0.05),
                                 name="slow-queue", version="1")
        try:
            running = asyncio.ensure_future(batcher.submit(0))
            await _wait_started(model)
            with pytest.raises(Overloaded, match=r"waited 0.05s in its queue"):
                await asyncio.wait_for(batcher.submit(1), 5)
            # refused by its own timeout while the request ahead still holds the model (the
            # test opens it only below), not when the model became free
            assert not running.done()
            assert num_refused("slow-queue", "queue_timeout") == 1
            assert num_refused("slow-queue", "queue_full") == 0
            model.opened.set()
            # the first request had started: it is answered although it waited longer
            return [await running, await batcher.submit(2)]
        finally:
            model.opened.set()
            await batcher.close()

    assert asyncio.run(go()) == [0, 4]
    assert 1 not in model.seen


def test_a_request_whose_batch_started_is_answered_past_the_timeout() -> None:
    model = Gate()

    async def go() -> int:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=1,
                                                       queue_timeout_s=0.02))
        try:
            submitted = asyncio.ensure_future(batcher.submit(5))
            await asyncio.sleep(0.1)  # well past the timeout, inside the model call
            model.opened.set()
            return await submitted
        finally:
            model.opened.set()
            await batcher.close()

    assert asyncio.run(go()) == 10


def test_a_client_that_leaves_the_queue_is_never_run() -> None:
    model = Gate()

    async def go() -> None:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=1))
        try:
            running = asyncio.ensure_future(batcher.submit(0))
            await _wait_started(model)
            leaving = asyncio.ensure_future(batcher.submit(1))
            assert await async_eventually(lambda: len(batcher._pending) == 1)  # queued
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)  # it left the queue
            model.opened.set()
            assert await running == 0
            assert await batcher.submit(2) == 4
        finally:
            model.opened.set()
            await batcher.close()

    asyncio.run(go())
    assert model.seen == [0, 2]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_queue", 0, "max_queue=0 must be >= 1"),
    ("queue_timeout_s", 0.0, "queue_timeout_s=0.0 must be > 0"),
], ids=["max-queue-zero", "timeout-zero"])
def test_bounds_are_checked_on_construction(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchingConfig(max_batch_size=4, **{field: value})


def test_leaving_or_timing_out_behind_other_array_requests_removes_only_that_one() -> None:
    """Queued items are told apart by identity: arrays have no truth value to compare by."""
    import numpy as np

    seen: list[int] = []
    gate = threading.Event()

    def model(items: list[np.ndarray]) -> list[np.ndarray]:
        seen.extend(int(item[0]) for item in items)
        gate.wait(10)
        return [item * 2 for item in items]

    async def go() -> list:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=1, queue_timeout_s=0.2))
        try:
            running = asyncio.ensure_future(batcher.submit(np.array([0.0, 0.5])))
            assert await async_eventually(lambda: seen)
            first = asyncio.ensure_future(batcher.submit(np.array([1.0, 1.5])))
            leaving = asyncio.ensure_future(batcher.submit(np.array([2.0, 2.5])))
            assert await async_eventually(lambda: len(batcher._pending) == 2)
            leaving.cancel()
            with pytest.raises(Overloaded):
                await first
            gate.set()
            return [(await running).tolist(), (await batcher.submit(np.array([3.0, 3.5]))
                                               ).tolist()]
        finally:
            gate.set()
            await batcher.close()

    assert asyncio.run(go()) == [[0.0, 1.0], [6.0, 7.0]]
    assert seen == [0, 3]
