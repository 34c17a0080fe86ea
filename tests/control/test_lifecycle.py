"""The instance lifecycle as a pure state machine: no process, no clock but the one passed in."""

from __future__ import annotations

import pytest

from podium.control.runtime import lifecycle
from podium.control.runtime.base import DRAINING, READY, STARTING, STOPPED
from podium.control.runtime.lifecycle import Life, Limits, Seen

LIMITS = Limits(max_restarts=2, drain_timeout_s=30.0, stop_timeout_s=10.0)


def test_a_started_instance_is_routed_once_its_probe_answers() -> None:
    life = lifecycle.start(Life(), now_s=5.0)
    assert lifecycle.wants_probe(life, exit_code=None)
    assert lifecycle.step(life, Seen(ready=False), 6.0, LIMITS).effects == ()
    move = lifecycle.step(life, Seen(ready=True), 7.0, LIMITS)
    assert move.life.state == READY
    assert move.effects == (lifecycle.SERVE, lifecycle.SAVE, lifecycle.ROUTE)
    # ready: each pass only updates its route's health from the probe
    assert lifecycle.step(move.life, Seen(ready=True), 8.0, LIMITS).effects == (
        lifecycle.MARK_HEALTH,)


def test_a_ready_instance_leaves_routing_after_three_failed_probes_in_a_row() -> None:
    life = Life(state=READY)
    for _ in range(2):  # a slow probe or two on a loaded host: still routed, nothing marked
        move = lifecycle.step(life, Seen(ready=False), 1.0, LIMITS)
        assert move.effects == ()
        life = move.life
    off = lifecycle.step(life, Seen(ready=False), 2.0, LIMITS)
    assert off.effects == (lifecycle.MARK_HEALTH,) and off.life.failed_probes == 3
    assert off.life.state == READY  # a hung instance leaves routing, not the plane
    back = lifecycle.step(off.life, Seen(ready=True), 3.0, LIMITS)
    assert back.effects == (lifecycle.MARK_HEALTH,) and back.life.failed_probes == 0
    # one answer in between starts the count again
    once = lifecycle.step(Life(state=READY, failed_probes=2), Seen(ready=True), 4.0, LIMITS)
    assert lifecycle.step(once.life, Seen(ready=False), 5.0, LIMITS).effects == ()
    strict = Limits(unhealthy_after=1)  # the old behaviour, one failure is enough
    assert lifecycle.step(Life(state=READY), Seen(ready=False), 6.0, strict).effects == (
        lifecycle.MARK_HEALTH,)


@pytest.mark.parametrize(("in_flight", "waited_s", "effects"), [
    (3, 29.0, ()),  # requests still finishing: wait
    (0, 1.0, (lifecycle.TERMINATE,)),  # none in flight: SIGTERM at once
    (3, 31.0, (lifecycle.TERMINATE,)),  # the drain ran out: SIGTERM anyway
    (3, 41.0, (lifecycle.KILL,)),  # still there past drain + stop: SIGKILL
], ids=["in-flight-waits", "idle-stops", "drain-timeout-terms", "stop-timeout-kills"])
def test_a_draining_instance_stops_when_its_requests_finish_or_time_runs_out(
        in_flight: int, waited_s: float, effects: tuple[str, ...]) -> None:
    life = lifecycle.drain(Life(state=READY), now_s=100.0)
    move = lifecycle.step(life, Seen(in_flight=in_flight), 100.0 + waited_s, LIMITS)
    assert (move.life.state, move.effects) == (DRAINING, effects)
    gone = lifecycle.step(life, Seen(exit_code=0), 100.0 + waited_s, LIMITS)
    assert gone.life.state == STOPPED
    assert gone.effects == (lifecycle.UNROUTE, lifecycle.RELEASE, lifecycle.SAVE)
    assert lifecycle.step(gone.life, Seen(), 200.0, LIMITS).effects == (lifecycle.FORGET,)


def test_a_crash_is_counted_once_and_restarted_until_the_limit() -> None:
    life = Life(state=READY)
    crash = lifecycle.step(life, Seen(exit_code=1), 1.0, LIMITS)
    assert crash.effects == (lifecycle.COUNT_CRASH, lifecycle.UNROUTE, lifecycle.RELEASE,
                             lifecycle.NOTE, lifecycle.RESTART)
    assert crash.note == "exited with status 1" and crash.life.num_restarts == 1
    # its restart failed (the database away): the next pass restarts it, counting nothing
    again = lifecycle.step(crash.life, Seen(exit_code=1), 2.0, LIMITS)
    assert again.effects == (lifecycle.RESTART,) and again.life.num_restarts == 1
    restarted = lifecycle.launched(lifecycle.start(crash.life, 3.0))
    assert (restarted.state, restarted.exit_seen) == (STARTING, False)
    last = lifecycle.step(Life(state=READY, num_restarts=2), Seen(exit_code=9), 4.0, LIMITS)
    assert last.effects[-1] == lifecycle.FAIL and last.life.state == STOPPED


@pytest.mark.parametrize(("stored", "state"), [(READY, STARTING), (STARTING, STARTING),
                                                (DRAINING, DRAINING)])
def test_an_adopted_instance_is_probed_again_or_keeps_draining(stored: str, state: str) -> None:
    life = lifecycle.adopt(stored, num_restarts=1, now_s=50.0)
    assert (life.state, life.num_restarts, life.started_s) == (state, 1, 50.0)
    assert life.drain_since_s == (50.0 if state == DRAINING else None)
