"""The autoscaling policy on a fake clock: in-flight requests and the engine's own signals."""

from __future__ import annotations

import pytest

from podium.control.actions import Scale
from podium.control.autoscale import (
    AutoscalePolicy,
    AutoscaleState,
    Demand,
    Deployment,
    decide,
    wanted,
)
from podium.errors import InvalidArgument

POLICY = AutoscalePolicy(min_instances=1, max_instances=4, target_in_flight=8,
                         scale_down_cooldown_ms=10_000)
# an LLM: 1 waiting request or 80% of the KV cache per instance, over 3 s, triggers scaling up
LLM = AutoscalePolicy(min_instances=1, max_instances=4, target_in_flight=64, target_waiting=1,
                      max_kv_cache_usage=0.8, scale_up_window_ms=3_000,
                      scale_down_cooldown_ms=10_000)
IDLE = Demand(in_flight=0, waiting=0, kv_cache_usage=0)
DEPLOYMENT = Deployment("m", "1")


def step(policy: AutoscalePolicy, state: AutoscaleState, demand: Demand,
         now_ms: int) -> AutoscaleState:
    """The state `decide` keeps (its actions: the test below)."""
    return decide(policy, state, demand, now_ms, DEPLOYMENT).state


def test_a_change_is_one_scale_action_and_no_change_none() -> None:
    decision = decide(POLICY, AutoscaleState(num_instances=1), Demand(in_flight=30), 500,
                      Deployment("m", "1", region="eu"))
    assert decision.actions == [Scale("m", "1", 4, region="eu")]
    assert decision.note == "autoscale: in_flight 30/instance > target 8"
    assert decision.state.num_instances == 4
    same = decide(POLICY, decision.state, Demand(in_flight=30), 600, DEPLOYMENT)
    assert same.actions == [] and same.state.num_instances == 4


def run(policy: AutoscalePolicy, state: AutoscaleState, demands: list[tuple[int, Demand]]
        ) -> list[tuple[int, int]]:
    """Decide at each (now_ms, demand); the (now_ms, count) of every change."""
    changes = []
    for now, demand in demands:
        before = state.num_instances
        state = step(policy, state, demand, now)
        if state.num_instances != before:
            changes.append((now, state.num_instances))
    return changes


@pytest.mark.parametrize(("in_flight", "expect"), [
    (0, 1), (1, 1), (8, 1), (9, 2), (24, 3), (1_000, 4),
], ids=["idle-keeps-min", "one", "exactly-target", "just-over", "three", "capped-at-max"])
def test_wanted_instances_follow_in_flight_within_bounds(in_flight: int, expect: int) -> None:
    assert wanted(POLICY, Demand(in_flight=in_flight), current=1) == expect


def test_scale_up_is_immediate_without_a_window() -> None:
    state = step(POLICY, AutoscaleState(num_instances=1), Demand(in_flight=30), now_ms=500)
    assert (state.num_instances, state.last_change_ms) == (4, 500)
    assert state.reason == "in_flight 30/instance > target 8"


def test_scale_down_waits_for_the_cooldown_then_steps_one_at_a_time() -> None:
    changes = run(POLICY, AutoscaleState(num_instances=4, last_change_ms=0),
                  [(now, Demand(in_flight=0)) for now in range(1_000, 40_001, 1_000)])
    assert changes == [(11_000, 3), (21_000, 2), (31_000, 1)]


def test_a_burst_during_cooldown_resets_the_low_timer() -> None:
    state = AutoscaleState(num_instances=2, last_change_ms=0)
    state = step(POLICY, state, Demand(in_flight=0), now_ms=20_000)
    state = step(POLICY, state, Demand(in_flight=16), now_ms=25_000)  # demand back at 2
    assert state.low_since_ms is None
    state = step(POLICY, state, Demand(in_flight=0), now_ms=26_000)
    state = step(POLICY, state, Demand(in_flight=0), now_ms=35_000)
    assert state.num_instances == 2  # low only since 26 s
    state = step(POLICY, state, Demand(in_flight=0), now_ms=36_000)
    assert state.num_instances == 1


def test_out_of_bounds_count_is_corrected_at_once() -> None:
    policy = AutoscalePolicy(min_instances=2, max_instances=3, scale_down_cooldown_ms=10_000)
    assert step(policy, AutoscaleState(num_instances=5), Demand(), now_ms=1).num_instances == 2
    assert step(policy, AutoscaleState(num_instances=0), Demand(), now_ms=1).num_instances == 2


def test_waiting_requests_scale_up_after_the_window() -> None:
    """3 requests queue in the engine of the one instance (in flight is far under its target)."""
    queued = Demand(in_flight=5, waiting=3, kv_cache_usage=0.2)
    changes = run(LLM, AutoscaleState(num_instances=1),
                  [(now, queued) for now in range(0, 5_001, 500)])
    assert changes == [(3_000, 3)]  # over since 0 ms; one instance per waiting request
    state = step(LLM, AutoscaleState(num_instances=1), queued, now_ms=0)
    state = step(LLM, state, queued, now_ms=3_000)
    assert state.reason == "waiting 3/instance > target 1"


def test_kv_cache_usage_scales_up_and_holds_while_one_fewer_would_pass_it() -> None:
    full = Demand(in_flight=2, waiting=0, kv_cache_usage=0.95)
    state = run_to(LLM, AutoscaleState(num_instances=1), full, 0, 3_000)
    assert state.num_instances == 2 and state.reason == (
        "kv_cache_usage 0.95/instance > target 0.8")
    # spread over two instances: 0.45 each; on one it would be 0.9 > 0.8, so it stays at two
    spread = Demand(in_flight=2, waiting=0, kv_cache_usage=0.45)
    assert run_to(LLM, state, spread, 4_000, 60_000).num_instances == 2
    # 0.35 each would be 0.7 on one: down after the cooldown
    light = Demand(in_flight=2, waiting=0, kv_cache_usage=0.35)
    assert run(LLM, state, [(now, light) for now in range(4_000, 20_001, 1_000)]) == [
        (14_000, 1)]


def run_to(policy: AutoscalePolicy, state: AutoscaleState, demand: Demand, start_ms: int,
           end_ms: int) -> AutoscaleState:
    """The state after deciding on the same demand every 500 ms from start to end."""
    for now in range(start_ms, end_ms + 1, 500):
        state = step(policy, state, demand, now)
    return state


def test_a_signal_that_dips_within_the_window_does_not_scale_up() -> None:
    """Waiting requests that come and go faster than the window: no instance for a spike."""
    spiky = [(now, Demand(waiting=4 if (now // 1_000) % 2 == 0 else 0, kv_cache_usage=0.1))
             for now in range(0, 60_001, 500)]
    assert run(LLM, AutoscaleState(num_instances=1), spiky) == []


def test_no_flapping_a_lull_shorter_than_the_cooldown_keeps_the_instances() -> None:
    """Up on a queue, then a 9 s lull and the queue again, for a minute: stays at 2."""
    queued = Demand(in_flight=4, waiting=2, kv_cache_usage=0.3)
    steady = Demand(in_flight=4, waiting=0.5, kv_cache_usage=0.3)  # on 2: 1 wanted each signal
    demands = [(now, queued) for now in range(0, 3_001, 500)]
    for start in range(3_500, 60_000, 12_000):
        demands += [(now, steady) for now in range(start, start + 9_000, 500)]
        demands += [(now, Demand(in_flight=4, waiting=1, kv_cache_usage=0.3))
                    for now in range(start + 9_000, start + 12_000, 500)]
    assert run(LLM, AutoscaleState(num_instances=1), demands) == [(3_000, 2)]


def test_down_only_after_every_signal_is_low_for_the_cooldown() -> None:
    state = AutoscaleState(num_instances=2, last_change_ms=0)
    # in flight and waiting are low, but the KV cache would not fit on one instance
    assert run(LLM, state, [(now, Demand(in_flight=1, waiting=0, kv_cache_usage=0.5))
                            for now in range(0, 30_001, 1_000)]) == []
    assert run(LLM, state, [(now, IDLE) for now in range(0, 30_001, 1_000)]) == [(10_000, 1)]


def test_an_unknown_engine_signal_is_not_a_zero() -> None:
    """Scrapes that failed: the policy neither scales up on them nor down for want of them."""
    unread = Demand(in_flight=0, waiting=None, kv_cache_usage=None, complete=False)
    state = AutoscaleState(num_instances=2, last_change_ms=0)
    assert run(LLM, state, [(now, unread) for now in range(0, 60_001, 1_000)]) == []
    # one instance of two read, and it is idle: still not enough to drop the other
    half = Demand(in_flight=0, waiting=0, kv_cache_usage=0, complete=False)
    assert run(LLM, state, [(now, half) for now in range(0, 60_001, 1_000)]) == []
    # in flight still scales up with the engine signals unknown
    busy = Demand(in_flight=200, waiting=None, kv_cache_usage=None, complete=False)
    assert run(LLM, state, [(now, busy) for now in range(0, 5_001, 500)]) == [(3_000, 4)]
    # an unread pass inside the window restarts it
    queued = Demand(waiting=3, kv_cache_usage=0.1)
    gappy = [(0, queued), (1_000, queued), (2_000, unread), (3_000, queued), (5_500, queued),
             (6_000, queued)]
    assert run(LLM, AutoscaleState(num_instances=1), gappy) == [(6_000, 3)]


def test_nothing_changes_while_an_instance_is_starting_and_the_cooldown_restarts() -> None:
    state = step(LLM, AutoscaleState(num_instances=1), Demand(waiting=5), now_ms=0)
    state = step(LLM, state, Demand(waiting=5), now_ms=3_000)
    assert state.num_instances == 4
    booting = Demand(in_flight=0, waiting=9, kv_cache_usage=0.99, num_starting=3)
    assert run(LLM, state, [(now, booting) for now in range(3_500, 60_001, 500)]) == []
    idle_from_60s = [(now, IDLE) for now in range(60_000, 90_001, 1_000)]
    assert run(LLM, state, idle_from_60s) == [(70_000, 3), (80_000, 2), (90_000, 1)]


def test_an_idle_deployment_at_its_floor_stays_there() -> None:
    policy = AutoscalePolicy(min_instances=2, max_instances=4, target_waiting=1)
    assert run(policy, AutoscaleState(num_instances=2),
               [(now, IDLE) for now in range(0, 600_001, 10_000)]) == []


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"min_instances": -1}, "min_instances"),
    ({"min_instances": 3, "max_instances": 2}, "max_instances"),
    ({"max_instances": 65}, "max_instances"),
    ({"target_in_flight": 0}, "target_in_flight"),
    ({"target_waiting": -1}, "target_waiting"),
    ({"max_kv_cache_usage": 0}, "max_kv_cache_usage"),
    ({"max_kv_cache_usage": 80}, "max_kv_cache_usage"),
    ({"scale_up_window_ms": -1}, "scale_up_window_ms"),
    ({"scale_down_cooldown_ms": -5}, "scale_down_cooldown_ms"),
], ids=["negative-min", "max-below-min", "max-too-large", "zero-target", "negative-waiting",
        "zero-kv", "kv-as-percent", "negative-window", "negative-cooldown"])
def test_bad_policy_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        AutoscalePolicy(**kwargs)
    assert info.value.param == field and field in info.value.message
