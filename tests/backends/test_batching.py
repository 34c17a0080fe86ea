"""DynamicBatcher: who shares a model call, when a batch is cut, how failures spread."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from podium.backends.batching import BatchingConfig, DynamicBatcher


class Recorder:
    """A model that doubles its inputs and remembers each batch it was given."""

    def __init__(self, delay_s: float = 0.0, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.fail_on = fail_on

    def __call__(self, items: list[int]) -> list[int]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        if self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on}")
        time.sleep(self.delay_s)
        return [2 * i for i in items]


async def submit_all(batcher: DynamicBatcher, items: list[int]) -> list:
    return await asyncio.gather(*(batcher.submit(i) for i in items), return_exceptions=True)


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_concurrent_requests_share_one_call_off_the_event_loop() -> None:
    model = Recorder()

    async def go() -> list:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=8, max_queue_delay_s=0.05))
        try:
            return await submit_all(batcher, list(range(8)))
        finally:
            await batcher.close()

    assert run(go()) == [2 * i for i in range(8)]
    assert model.batches == [list(range(8))]
    assert all(name.startswith("batch-") for name in model.threads)


def test_batches_never_exceed_max_size() -> None:
    model = Recorder()

    async def go() -> list:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=3, max_queue_delay_s=0.05))
        try:
            return await submit_all(batcher, list(range(7)))
        finally:
            await batcher.close()

    assert run(go()) == [2 * i for i in range(7)]
    assert [len(b) for b in model.batches] == [3, 3, 1]


def test_item_sizes_count_toward_the_max() -> None:
    model = Recorder()

    async def go() -> None:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=4, max_queue_delay_s=0.05),
                                 size_of=lambda item: item)
        try:
            await submit_all(batcher, [3, 1, 2, 2])
        finally:
            await batcher.close()

    run(go())
    assert model.batches == [[3, 1], [2, 2]]


def test_a_lone_request_waits_at_most_the_queue_delay() -> None:
    model = Recorder()

    async def go() -> float:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=64,
                                                       max_queue_delay_s=0.02))
        try:
            started = time.perf_counter()
            assert await batcher.submit(5) == 10
            return time.perf_counter() - started
        finally:
            await batcher.close()

    elapsed = run(go())
    assert 0.015 < elapsed < 0.5


def test_preferred_size_cuts_without_waiting() -> None:
    model = Recorder()

    async def go() -> float:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=64, max_queue_delay_s=5,
                                                       preferred_batch_sizes=(2, 4)))
        try:
            started = time.perf_counter()
            await submit_all(batcher, [1, 2, 3, 4])
            return time.perf_counter() - started
        finally:
            await batcher.close()

    assert run(go()) < 1  # the 5 s delay never ran out: 4 is preferred
    assert model.batches == [[1, 2, 3, 4]]


def test_incompatible_items_go_to_separate_calls() -> None:
    model = Recorder()

    async def go() -> None:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=8, max_queue_delay_s=0.02),
                                 signature_of=lambda item: item % 2)
        try:
            await submit_all(batcher, [1, 2, 3, 4])
        finally:
            await batcher.close()

    run(go())
    assert sorted(model.batches) == [[1, 3], [2, 4]]


def test_a_failing_batch_fails_its_requests_only() -> None:
    model = Recorder(fail_on=3)

    async def go() -> tuple[list, int]:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=2, max_queue_delay_s=0.02))
        try:
            results = await submit_all(batcher, [1, 2, 3, 4])
            return results, await batcher.submit(7)
        finally:
            await batcher.close()

    results, later = run(go())
    assert results[:2] == [2, 4]
    assert all(isinstance(r, ValueError) for r in results[2:])
    assert later == 14


def test_requests_arriving_during_a_call_form_the_next_batch() -> None:
    model = Recorder(delay_s=0.1)

    async def go() -> None:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=16, max_queue_delay_s=0))
        try:
            first = asyncio.create_task(batcher.submit(0))
            await asyncio.sleep(0.03)  # the model is busy with [0]
            await submit_all(batcher, list(range(1, 6)))
            await first
        finally:
            await batcher.close()

    run(go())
    assert model.batches == [[0], [1, 2, 3, 4, 5]]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_batch_size": 0}, "max_batch_size=0"),
    ({"max_batch_size": 4, "max_queue_delay_s": -1}, "max_queue_delay_s=-1"),
], ids=["zero-size", "negative-delay"])
def test_config_is_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchingConfig(**kwargs)


def test_numpy_items_round_trip() -> None:
    async def go() -> list:
        batcher = DynamicBatcher(lambda items: [a + 1 for a in items],
                                 BatchingConfig(max_batch_size=4, max_queue_delay_s=0.01))
        try:
            return await submit_all(batcher, [np.arange(3), np.arange(2)])
        finally:
            await batcher.close()

    first, second = run(go())
    assert first.tolist() == [1, 2, 3] and second.tolist() == [1, 2]
