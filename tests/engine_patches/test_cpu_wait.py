"""The CPU wait fix on vLLM's own `SpinCondition`: a patched reader with nothing to read blocks
on the writer's notification at once (vLLM's would `sched_yield` and look again for a second),
and the notification written before it looks still wakes it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import zmq

from podium.engine_patches import cpu_wait


@pytest.fixture
def condition(monkeypatch):
    """vLLM's SpinCondition unpatched for the test, restored after it (an engine test's vLLM
    may already have patched it in this process)."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = SpinCondition.__init__
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    monkeypatch.setattr(SpinCondition, "__init__", original)
    monkeypatch.setattr(SpinCondition, cpu_wait._MARK, False, raising=False)
    return SpinCondition


def _pair(cls, address: str):
    context = zmq.Context()
    writer = cls(is_reader=False, context=context, notify_address=address)
    reader = cls(is_reader=True, context=context, notify_address=address)
    return context, writer, reader


def _polls(reader) -> list[int | None]:
    """Record the reader's blocking polls (what it does instead of spinning)."""
    calls: list[int | None] = []
    poll = reader.poller.poll

    def recording(timeout=None):
        calls.append(timeout)
        return poll(timeout=timeout)

    reader.poller.poll = recording
    return calls


def test_unpatched_a_reader_spins_after_a_read(condition, tmp_path) -> None:
    context, _, reader = _pair(condition, f"ipc://{tmp_path}/a")
    calls = _polls(reader)
    reader.record_read()
    reader.wait(timeout_ms=10)
    assert reader.busy_loop_s == 1 and calls == []  # the sched_yield path: vLLM's spin
    context.destroy(linger=0)


def test_patched_a_reader_blocks_on_the_notification_and_is_woken_by_it(
        condition, tmp_path) -> None:
    cpu_wait.patch(condition)
    cpu_wait.patch(condition)  # idempotent: wrapped once
    assert not hasattr(condition.__init__.__wrapped__, "__wrapped__")
    context, writer, reader = _pair(condition, f"ipc://{tmp_path}/b")
    assert reader.busy_loop_s == 0 and writer.busy_loop_s == 0
    calls = _polls(reader)
    reader.record_read()
    reader.wait(timeout_ms=10)  # nothing written: it polls (and times out), no spin
    assert calls == [10]
    for _ in range(200):  # the SUB socket connects asynchronously: notify until one lands
        writer.notify()
        if reader.poller.poll(timeout=10):
            break
    reader.wait(timeout_ms=60_000)  # a notification sent before the wait wakes it
    assert calls[-1] == 60_000 and not reader.poller.poll(timeout=0)  # and it was consumed
    context.destroy(linger=0)


def test_applies_on_the_cpu_engine_unless_turned_off(monkeypatch) -> None:
    from vllm.platforms import current_platform

    monkeypatch.delenv("PODIUM_ENGINE_BUSY_WAIT", raising=False)
    assert cpu_wait.applies() == current_platform.is_cpu()
    monkeypatch.setenv("PODIUM_ENGINE_BUSY_WAIT", "1")
    assert not cpu_wait.applies()


def test_declared_as_a_vllm_plugin() -> None:
    """pyproject.toml registers it for engine processes Podium's code does not start."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    plugins = tomllib.loads(pyproject.read_text())["project"]["entry-points"][
        "vllm.general_plugins"]
    assert plugins["podium_cpu_wait"] == "podium.engine_patches.cpu_wait:register"
