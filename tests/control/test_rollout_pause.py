"""An operator pauses and resumes a rollout: it holds its stage (no step, no analysis, no timer)
and continues where it stood; through the API, the CLI and the pure state machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from podium.control import region_rollout, rollout
from podium.control.api import create_app
from podium.control.region_rollout import RegionRollout
from podium.control.rollout_config import RolloutConfig
from tests.support.control_api import FAST, Env, deployed
from tests.support.control_cli import podium
from tests.support.servers import Served

STAGED = {**FAST, "stages": [50, 100], "analysis_window_ms": 2_000}


def _at_first_analysis(env: Env) -> int:
    """iris@2 rolling out, at its 50% stage, its analysis window just begun."""
    deployed(env)
    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2", **STAGED})
    assert r.status_code == 201, r.text
    rollout_id = r.json()["id"]
    while env.client.get(f"/v1/rollouts/{rollout_id}").json()["phase"] != "analyze":
        env.plane.tick()
        env.world.now_ms += 250
    return rollout_id


def _tick_for(env: Env, ms: int) -> None:
    end = env.world.now_ms + ms
    while env.world.now_ms < end:
        env.plane.tick()
        env.world.now_ms += 250


def test_a_paused_rollout_holds_its_stage_then_continues_where_it_stood(tmp_path: Path) -> None:
    env = Env(tmp_path)
    rollout_id = _at_first_analysis(env)
    before = env.client.get(f"/v1/rollouts/{rollout_id}").json()

    r = env.client.post(f"/v1/rollouts/{rollout_id}/pause")
    assert r.status_code == 200, r.text
    assert r.json()["phase"] == "paused" and r.json()["paused_since_ms"] == env.world.now_ms
    assert r.json()["status"] == "running" and r.json()["stage"] == "1/2"
    applied = len(env.world.applied)
    _tick_for(env, 30_000)  # far past the analysis window: nothing may happen
    held = env.client.get(f"/v1/rollouts/{rollout_id}").json()
    assert held["num_steps"] == before["num_steps"] + 1  # only the pause itself
    assert held["stage"] == "1/2" and held["weight_new"] == 50
    assert len(env.world.applied) == applied and env.world.split["iris"] == {"1": 50, "2": 50}
    events = env.client.get("/v1/events", params={"model": "iris", "limit": 5}).json()
    assert events[0]["kind"] == "rollout.paused"
    assert "paused by operator at stage 1/2 (analyze, 50% on 2)" in events[0]["message"]

    # a second pause is refused with the reason; the resume that follows is accepted
    again = env.client.post(f"/v1/rollouts/{rollout_id}/pause")
    assert again.status_code == 409
    assert "cannot be paused: it is already paused" in again.json()["error"]["message"]
    r = env.client.post(f"/v1/rollouts/{rollout_id}/resume")
    assert r.status_code == 200, r.text
    assert r.json()["phase"] == "analyze" and r.json()["paused_since_ms"] is None
    events = env.client.get("/v1/events", params={"model": "iris", "limit": 1}).json()
    assert events[0]["kind"] == "rollout.resumed" and "resumed by operator after 30.0 s" in (
        events[0]["message"])

    # the pause did not count as analysis time: the whole window is still ahead
    _tick_for(env, 1_500)
    assert env.client.get(f"/v1/rollouts/{rollout_id}").json()["stage"] == "1/2"
    env.run_until_done(limit_ms=env.world.now_ms + 60_000)
    done = env.client.get(f"/v1/rollouts/{rollout_id}").json()
    assert done["status"] == "succeeded", done["reason"]
    assert env.world.split["iris"] == {"2": 100}

    refused = env.client.post(f"/v1/rollouts/{rollout_id}/resume")
    assert refused.status_code == 409
    assert refused.json()["error"]["message"] == (
        f"rollout {rollout_id} of iris is succeeded; only a paused rollout resumes")
    assert env.client.post(f"/v1/rollouts/{rollout_id}/pause").status_code == 409
    assert env.client.post("/v1/rollouts/999/pause").status_code == 404
    env.store.close()


def test_resume_of_a_running_rollout_is_refused_and_rollback_ends_a_pause(
        tmp_path: Path) -> None:
    env = Env(tmp_path)
    rollout_id = _at_first_analysis(env)
    r = env.client.post(f"/v1/rollouts/{rollout_id}/resume")
    assert r.status_code == 409
    assert "is running, not paused; only a paused rollout resumes" in r.json()["error"]["message"]
    assert env.client.post(f"/v1/rollouts/{rollout_id}/pause").status_code == 200

    r = env.client.post("/v1/models/iris/rollback")  # an operator's rollback is never held
    assert r.status_code == 200, r.text
    assert r.json()["paused_since_ms"] is None
    env.run_until_done(limit_ms=env.world.now_ms + 60_000)
    assert env.store.get_rollout(rollout_id).status == rollout.ROLLED_BACK
    assert env.world.split["iris"]["1"] == 100
    env.store.close()


def test_pause_and_resume_need_the_admin_key(tmp_path: Path) -> None:
    env = Env(tmp_path)
    rollout_id = _at_first_analysis(env)
    guarded = TestClient(create_app(env.plane, api_key="sekret"))
    assert guarded.post(f"/v1/rollouts/{rollout_id}/pause").status_code == 401
    r = guarded.post(f"/v1/rollouts/{rollout_id}/pause",
                     headers={"Authorization": "Bearer sekret"})
    assert r.status_code == 200 and r.json()["phase"] == "paused"
    env.store.close()


def test_the_cli_pauses_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = Env(tmp_path)
    rollout_id = _at_first_analysis(env)
    served = Served(create_app(env.plane))
    try:
        assert podium("rollout", "pause", str(rollout_id), "--api", served.url) == 0
        assert f"#{rollout_id} iris 1 -> 2 red-black running paused 50%" in (
            capsys.readouterr().out)
        assert podium("rollout", "pause", str(rollout_id), "--api", served.url) == 2
        assert "it is already paused" in capsys.readouterr().err
        assert podium("rollout", "resume", str(rollout_id), "--api", served.url) == 0
        assert "running analyze 50%" in capsys.readouterr().out
    finally:
        served.stop()
        env.store.close()


def _leg(**changes: object) -> RegionRollout:
    config = RolloutConfig(stages=(50, 100), analysis_window_ms=2_000)
    leg = rollout.begin("iris", "2", "1", config, num_old=2, now_ms=0)
    return region_rollout.single(leg.__class__(**{**leg.__dict__, **changes}))


def test_pause_rules_of_the_state_machine() -> None:
    analyzing = _leg(phase="analyze", phase_since_ms=1_000, split={"1": 50, "2": 50})
    assert region_rollout.can_pause(analyzing) is None
    paused = region_rollout.pause(analyzing, 1_500, "operator").state
    assert paused.phase == "paused" and paused.leg.phase == "analyze"
    # a plane that could not act does not move a paused rollout's timers (unpause will)
    assert region_rollout.resume(paused, 60_000, "database away") is None
    assert region_rollout.step(paused, {}, 99_000) is None  # nothing observed, nothing judged
    resumed = region_rollout.unpause(paused, 11_500, "operator").state
    assert resumed.paused_since_ms is None and resumed.leg.phase_since_ms == 11_000
    assert RegionRollout.from_dict(paused.to_dict()) == paused
    stored_before = {k: v for k, v in analyzing.to_dict().items() if k != "paused_since_ms"}
    assert RegionRollout.from_dict(stored_before).paused_since_ms is None
    rolling_back = _leg(phase=rollout.ROLL_BACK)
    assert "rolling back" in (region_rollout.can_pause(rolling_back) or "")
    assert region_rollout.can_pause(_leg(status=rollout.SUCCEEDED, phase="done")) == (
        "it is succeeded")
