"""A Red-Black stage with too few requests on the new version when its window ends: with
`evidence_wait_ms` it serves on until the requests are there (then judged), or until the wait
runs out (then it passes for lack of evidence, as it does at once by default)."""

from __future__ import annotations

import pytest

from podium.control import rollout
from podium.control.rollout import Observation, RolloutState, VersionHealth
from podium.control.rollout_config import RolloutConfig
from podium.errors import InvalidArgument

OLD = VersionHealth(num_ready=1, num_requests=40, p99_ms=20.0)


def _analyzing(evidence_wait_ms: int) -> RolloutState:
    config = RolloutConfig(stages=(50, 100), min_requests=5, analysis_window_ms=1_000,
                           evidence_wait_ms=evidence_wait_ms)
    state = rollout.begin("tone", "2", "1", config, num_old=1)
    ready = Observation(new=VersionHealth(num_ready=1), old=OLD)
    for now in (0, 10):  # start, ready: 50% moves and the first window opens at 10 ms
        decision = rollout.step(state, ready, now)
        assert decision is not None
        state = decision.state
    assert (state.phase, state.weight_new) == ("analyze", 50)
    return state


def _seen(requests: int, errors: int = 0) -> Observation:
    return Observation(new=VersionHealth(num_ready=1, num_requests=requests, num_errors=errors,
                                         p99_ms=25.0 if requests else None), old=OLD)


def test_without_a_wait_a_window_with_no_requests_passes_at_once() -> None:
    decision = rollout.step(_analyzing(0), _seen(0), 1_100)
    assert decision is not None and "analysis passed at 50%" in decision.note
    assert "2: 0 requests" in decision.note  # the note says what it rested on


def test_the_stage_waits_for_evidence_and_judges_it_when_it_comes() -> None:
    state = _analyzing(10_000)
    for now in (1_100, 4_000, 9_000):  # window over, still fewer than min_requests answered
        assert rollout.step(state, _seen(2), now) is None
    decision = rollout.step(state, _seen(5, errors=5), 9_500)
    assert decision is not None and decision.state.status == rollout.ROLLED_BACK
    assert "analysis failed at 50%: error rate" in (decision.state.reason or "")


def test_past_the_wait_a_stage_without_evidence_passes() -> None:
    state = _analyzing(3_000)
    assert rollout.step(state, _seen(1), 3_900) is None
    decision = rollout.step(state, _seen(1), 4_100)  # window 1 s + wait 3 s since 10 ms
    assert decision is not None and "analysis passed at 50%" in decision.note
    assert decision.state.status == rollout.RUNNING


def test_a_negative_wait_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument) as info:
        RolloutConfig(evidence_wait_ms=-1)
    assert info.value.param == "evidence_wait_ms"
