"""The engine core's readers sleep at once (no spin) when its worker's team has every core."""

from __future__ import annotations

import sys
import types

import pytest

from podium.preload import waits


@pytest.mark.parametrize(("bind", "cpus"), [
    ("0,1", {0, 1}), ("0-3", {0, 1, 2, 3}), ("0-1|2-3", {0, 1, 2, 3}), ("auto", None),
    ("nobind", None), ("", None), ("0,x", None)])
def test_a_binding_is_read_as_vllm_writes_it(bind: str, cpus: set[int] | None) -> None:
    assert waits.bound_cpus(bind) == cpus


@pytest.mark.parametrize(("env", "cpus", "expected"), [
    ({"VLLM_CPU_OMP_THREADS_BIND": "0,1", "PODIUM_ENGINE_SPIN": "0"}, [0, 1], True),
    ({"VLLM_CPU_OMP_THREADS_BIND": "0", "PODIUM_ENGINE_SPIN": "0"}, [0, 1], False),  # a core left
    ({"PODIUM_ENGINE_SPIN": "0"}, [0, 1], False),  # vLLM's auto: it reserves one
    ({"VLLM_CPU_OMP_THREADS_BIND": "0,1"}, [0, 1], False),  # the default: vLLM's spin
], ids=["every-core", "one-of-two", "auto", "spin-by-default"])
def test_only_a_team_on_every_core_quiets_the_waits(env: dict[str, str], cpus: list[int],
                                                   expected: bool) -> None:
    assert waits.quiet(env, cpus) is expected


def test_install_makes_readers_sleep_and_leaves_writers(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[bool, float]] = []

    class SpinCondition:
        def __init__(self, is_reader: bool, context: object, notify_address: str,
                     busy_loop_s: float = 1) -> None:
            made.append((is_reader, busy_loop_s))

    fake = types.ModuleType(waits.QUEUE_MODULE)
    fake.SpinCondition = SpinCondition  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, waits.QUEUE_MODULE, fake)
    monkeypatch.setattr(waits.os, "sched_getaffinity", lambda _: {0, 1})
    waits.install({"VLLM_CPU_OMP_THREADS_BIND": "1", "PODIUM_ENGINE_SPIN": "0"})  # untouched
    SpinCondition(is_reader=True, context=None, notify_address="x")
    waits.install({"VLLM_CPU_OMP_THREADS_BIND": "0,1", "PODIUM_ENGINE_SPIN": "0"})
    SpinCondition(is_reader=True, context=None, notify_address="x")
    SpinCondition(is_reader=False, context=None, notify_address="x")
    assert made == [(True, 1), (True, 0), (False, 1)]
