"""The autoscaling policy on a fake clock."""

from __future__ import annotations

import pytest

from podium.control.autoscale import AutoscalePolicy, AutoscaleState, decide, wanted
from podium.errors import InvalidArgument

POLICY = AutoscalePolicy(min_instances=1, max_instances=4, target_in_flight=8,
                         scale_down_cooldown_ms=10_000)


@pytest.mark.parametrize(("in_flight", "expect"), [
    (0, 1), (1, 1), (8, 1), (9, 2), (24, 3), (1_000, 4),
], ids=["idle-keeps-min", "one", "exactly-target", "just-over", "three", "capped-at-max"])
def test_wanted_instances_follow_in_flight_within_bounds(in_flight: int, expect: int) -> None:
    assert wanted(POLICY, in_flight) == expect


def test_scale_up_is_immediate() -> None:
    state = decide(POLICY, AutoscaleState(num_instances=1), in_flight=30, now_ms=500)
    assert (state.num_instances, state.last_change_ms) == (4, 500)


def test_scale_down_waits_for_the_cooldown_then_steps_one_at_a_time() -> None:
    state = AutoscaleState(num_instances=4, last_change_ms=0)
    counts = []
    for now in range(1_000, 40_001, 1_000):
        state = decide(POLICY, state, in_flight=0, now_ms=now)
        counts.append((now, state.num_instances))
    changes = [(now, n) for (now, n), (_, before) in zip(counts, [(0, 4), *counts], strict=False)
               if n != before]
    assert changes == [(11_000, 3), (21_000, 2), (31_000, 1)]


def test_a_burst_during_cooldown_resets_the_low_timer() -> None:
    state = AutoscaleState(num_instances=2, last_change_ms=0)
    state = decide(POLICY, state, in_flight=0, now_ms=20_000)
    state = decide(POLICY, state, in_flight=16, now_ms=25_000)  # demand back at 2 instances
    assert state.low_since_ms is None
    state = decide(POLICY, state, in_flight=0, now_ms=26_000)
    state = decide(POLICY, state, in_flight=0, now_ms=35_000)
    assert state.num_instances == 2  # low only since 26 s
    state = decide(POLICY, state, in_flight=0, now_ms=36_000)
    assert state.num_instances == 1


def test_out_of_bounds_count_is_corrected_at_once() -> None:
    policy = AutoscalePolicy(min_instances=2, max_instances=3, scale_down_cooldown_ms=10_000)
    assert decide(policy, AutoscaleState(num_instances=5), 0, now_ms=1).num_instances == 2
    assert decide(policy, AutoscaleState(num_instances=0), 0, now_ms=1).num_instances == 2


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"min_instances": -1}, "min_instances"),
    ({"min_instances": 3, "max_instances": 2}, "max_instances"),
    ({"max_instances": 65}, "max_instances"),
    ({"target_in_flight": 0}, "target_in_flight"),
    ({"scale_down_cooldown_ms": -5}, "scale_down_cooldown_ms"),
], ids=["negative-min", "max-below-min", "max-too-large", "zero-target", "negative-cooldown"])
def test_bad_policy_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        AutoscalePolicy(**kwargs)
    assert info.value.param == field and field in info.value.message
