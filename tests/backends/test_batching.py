"""DynamicBatcher: who shares a model call, when a batch is cut, how failures spread."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import numpy as np
import pytest

from podium.backends.batching import BatchingConfig, DynamicBatcher
from podium.errors import BackendDead, BackendError, InvalidArgument
from tests.support.polling import async_eventually


class Recorder:
    """A model that doubles its inputs and remembers each batch it was given."""

    def __init__(self, delay_s: float = 0.0, fail_on: int | None = None,
                 held: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.fail_on = fail_on
        # held: each call blocks until the test sets `release` (or 10 s pass)
        self.release = threading.Event()
        if not held:
            self.release.set()
        self.returned = 0  # calls that ran to their end

    def __call__(self, items: list[int]) -> list[int]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        if self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on}")
        time.sleep(self.delay_s)
        self.release.wait(10)
        self.returned += 1
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
    """Cut by the delay, not by size (64 never comes); never before the delay's timer fired."""
    delay_s = 0.02
    fired = threading.Event()
    fired_before_the_call: list[bool] = []

    def model(items: list[int]) -> list[int]:
        fired_before_the_call.append(fired.is_set())
        return [2 * i for i in items]

    async def go() -> int:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=64,
                                                       max_queue_delay_s=delay_s))
        try:
            # scheduled before the request is queued, so due no later than the batcher's deadline
            asyncio.get_running_loop().call_later(delay_s, fired.set)
            return await asyncio.wait_for(batcher.submit(5), 10)  # bounded: no company needed
        finally:
            await batcher.close()

    assert run(go()) == 10
    assert fired_before_the_call == [True]


def test_preferred_size_cuts_without_waiting() -> None:
    model = Recorder()

    async def go() -> list:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=64, max_queue_delay_s=3600,
                                                       preferred_batch_sizes=(2, 4)))
        try:
            # the hour's delay never runs out inside the wait: 4 is preferred, so it is cut
            return await asyncio.wait_for(submit_all(batcher, [1, 2, 3, 4]), 30)
        finally:
            await batcher.close()

    assert run(go()) == [2, 4, 6, 8]
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
    model = Recorder(held=True)

    async def go() -> None:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=16, max_queue_delay_s=0))
        try:
            first = asyncio.create_task(batcher.submit(0))
            assert await async_eventually(lambda: model.batches)  # the model is busy with [0]
            rest = asyncio.ensure_future(submit_all(batcher, list(range(1, 6))))
            # all five arrived while the test still holds the call of [0]
            assert await async_eventually(lambda: len(batcher._pending) == 5)
            model.release.set()
            await asyncio.wait_for(asyncio.gather(first, rest), 10)
        finally:
            model.release.set()
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


def test_an_empty_item_is_refused_before_it_is_queued() -> None:
    model = Recorder()

    async def go() -> int:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=8, max_queue_delay_s=0.01),
                                 size_of=lambda item: item, name="m", version="1")
        try:
            with pytest.raises(InvalidArgument, match=r"m@1 got an empty batch \(batch size 0\)"):
                await batcher.submit(0)
            return await asyncio.wait_for(batcher.submit(3), 5)
        finally:
            await batcher.close()

    assert run(go()) == 6
    assert model.batches == [[3]]  # the empty one never reached the model


def test_a_fault_in_the_loop_fails_its_batch_logs_it_and_the_loop_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from podium.metrics import server as metrics

    real = metrics.observe_batch
    calls = []

    def observe_once_broken(model: str, version: str, size: int) -> None:
        calls.append(size)
        if len(calls) == 1:
            raise ValueError("bookkeeping broke")
        real(model, version, size)

    monkeypatch.setattr(metrics, "observe_batch", observe_once_broken)
    model = Recorder()

    async def go() -> tuple[list, int]:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=2, max_queue_delay_s=0.02),
                                 name="m", version="1")
        try:
            first = await asyncio.wait_for(submit_all(batcher, [1, 2]), 5)
            return first, await asyncio.wait_for(batcher.submit(7), 5)
        finally:
            await batcher.close()

    with caplog.at_level(logging.ERROR, logger="podium.backends.batching"):
        first, later = run(go())
    assert all(isinstance(r, BackendError) and "bookkeeping broke" in str(r) for r in first)
    assert later == 14
    assert model.batches == [[7]]
    record = next(r for r in caplog.records if "m@1 failed a batch" in r.getMessage())
    assert record.exc_info is not None and "bookkeeping broke" in str(record.exc_info[1])


async def _kill_during_call(batcher: DynamicBatcher, model: Recorder, item: int,
                            queued: list[int] = ()) -> tuple[BaseException, list[asyncio.Task]]:
    """Submit `item` (then `queued`, which wait behind it), cancel the loop's task while the
    model (held by the test) runs `item`; the request's error and the queued requests."""
    waiting = asyncio.create_task(batcher.submit(item))
    assert await async_eventually(lambda: [item] in model.batches)  # the model is busy with it
    behind = [asyncio.create_task(batcher.submit(i)) for i in queued]
    await asyncio.sleep(0)
    assert batcher._task is not None
    batcher._task.cancel()
    try:
        with pytest.raises(BackendError) as err:
            await asyncio.wait_for(waiting, 5)
        # at once: it failed while its model call was still held open, not when it returned
        assert model.returned == 0, "the waiting request did not fail at once"
    finally:
        model.release.set()
    return err.value, behind


def test_a_killed_loop_fails_its_batch_at_once_and_is_restarted(
        caplog: pytest.LogCaptureFixture) -> None:
    model = Recorder(held=True)

    async def go() -> tuple[BaseException, int, bool]:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=4, max_queue_delay_s=0),
                                 name="m", version="1", max_restarts=1)
        try:
            error, (queued,) = await _kill_during_call(batcher, model, 1, [4])
            # the queued request is served by the restarted loop; so is a later one
            assert await asyncio.wait_for(queued, 5) == 8
            return error, await asyncio.wait_for(batcher.submit(5), 5), batcher.is_alive()
        finally:
            await batcher.close()

    with caplog.at_level(logging.WARNING, logger="podium.backends.batching"):
        error, later, alive = run(go())
    assert "stopped while running this request" in str(error)
    assert later == 10 and alive
    assert any("restarting the dynamic batcher of m@1 (restart 1 of 1)" in r.getMessage()
               for r in caplog.records)


def test_a_loop_killed_past_its_restarts_is_dead_and_fails_fast() -> None:
    model = Recorder(held=True)

    async def go() -> None:
        batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=4, max_queue_delay_s=0),
                                 name="m", version="1", max_restarts=0)
        try:
            error, (queued,) = await _kill_during_call(batcher, model, 1, [2])
            assert isinstance(error, BackendDead)
            with pytest.raises(BackendDead, match="m@1 is dead"):
                await asyncio.wait_for(queued, 1)
            assert not batcher.is_alive()
            with pytest.raises(BackendDead, match="must be restarted"):
                await asyncio.wait_for(batcher.submit(3), 1)
        finally:
            await batcher.close()

    run(go())
