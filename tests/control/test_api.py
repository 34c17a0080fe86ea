"""The control-plane REST API: every bad request is a clear 4xx and changes nothing."""

from __future__ import annotations

import pytest

from tests.support.control_api import FAST, Env, deployed, package_dir


def test_announce_deploy_and_roll_out_a_new_version(env: Env) -> None:
    deployed(env)
    r = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2",
                                              "stages": [50, 100], **FAST})
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["from_version"], body["to_version"], body["status"]) == ("1", "2", "running")
    env.run_until_done()
    detail = env.client.get(f"/v1/rollouts/{body['id']}").json()
    assert detail["status"] == "succeeded"
    assert [s["phase"] for s in detail["steps"]][-1] == "done"
    status = env.client.get("/v1/status").json()
    assert status["models"]["iris"]["splits"] == {"2": 100}
    assert status["models"]["iris"]["aliases"] == {"latest": "2"}
    assert env.world.split["iris"] == {"2": 100}


def test_second_rollout_of_a_model_while_one_runs_is_409(env: Env) -> None:
    deployed(env)
    first = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2", **FAST})
    assert first.status_code == 201
    before = env.snapshot()
    second = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2", **FAST})
    assert second.status_code == 409
    assert second.json()["error"]["param"] == "model"
    assert "still running" in second.json()["error"]["message"]
    assert env.snapshot() == before


def test_rollback_of_a_running_rollout_returns_all_traffic_to_old(env: Env) -> None:
    deployed(env)
    rid = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2", **FAST}).json()
    env.world.now_ms += 1_500
    env.plane.tick()
    r = env.client.post("/v1/models/iris/rollback")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == rid["id"] and r.json()["status"] == "rolled_back"
    assert env.world.split["iris"] == {"1": 100, "2": 0}


def test_rollback_after_success_rolls_out_the_previous_version(env: Env) -> None:
    deployed(env)
    env.client.post("/v1/rollouts", json={"model": "iris", "version": "2", **FAST})
    env.run_until_done()
    r = env.client.post("/v1/models/iris/rollback")
    assert r.status_code == 200, r.text
    assert (r.json()["from_version"], r.json()["to_version"]) == ("2", "1")
    env.run_until_done()
    assert env.store.splits("iris") == {"1": 100}


BAD_REQUESTS = [
    ("post", "/v1/packages", {"path": "/nonexistent/pkg"}, 400, "path",
     "No such file or directory"),
    ("post", "/v1/packages", {"paht": "/x"}, 400, "path",
     "path: is required; paht: is not a known field"),
    ("post", "/v1/packages", {"path": "x", "force": True}, 400, "force", "not a known field"),
    ("post", "/v1/rollouts", {"model": "iris", "version": "9"}, 404, "version",
     "iris@9 is not announced; announced versions: 1, 2"),
    ("post", "/v1/rollouts", {"model": "nope", "version": "1"}, 404, "version",
     "announce it first"),
    ("post", "/v1/rollouts", {"model": "iris", "version": "2", "stages": [50, 10, 100]}, 400,
     "stages", "must be increasing"),
    ("post", "/v1/rollouts", {"model": "iris", "version": "2", "strategy": "canary"}, 400,
     "strategy", "red-black"),
    ("post", "/v1/rollouts", {"model": "iris", "version": "2", "num_instances": 0}, 400,
     "num_instances", "num_instances=0 is out of range"),
    ("post", "/v1/rollouts", {"model": "Bad Name!", "version": "2"}, 400, "model",
     "should match pattern"),
    ("post", "/v1/rollouts", {"model": "iris", "version": "1"}, 400, "version",
     "already takes all"),
    ("put", "/v1/deployments/iris/1/scaling", {"min_instances": 2, "max_instances": 65}, 400,
     "max_instances", "max_instances=65 is out of range"),
    ("put", "/v1/deployments/iris/1/scaling", {"min_instances": 3, "max_instances": 2}, 400,
     "min_instances", "exceeds max_instances"),
    ("put", "/v1/deployments/iris/7/scaling", {"min_instances": 1, "max_instances": 2}, 404,
     "version", "no deployment of iris@7"),
    ("post", "/v1/models/ghost/rollback", None, 404, "model", "has no deployment"),
    ("get", "/v1/rollouts/999", None, 404, "rollout_id", "no rollout 999"),
]


@pytest.mark.parametrize(("method", "url", "body", "status", "param", "message"), BAD_REQUESTS,
                         ids=["missing-package", "misspelt-path", "unknown-field",
                              "unknown-version", "unknown-model", "bad-stages", "bad-strategy",
                              "zero-instances",
                              "bad-model-name", "same-version", "max-too-large", "min-above-max",
                              "scaling-unknown-version", "rollback-unknown-model",
                              "unknown-rollout"])
def test_bad_request_is_a_clear_4xx_and_changes_nothing_then_a_good_one_works(
        env: Env, method: str, url: str, body: dict | None, status: int, param: str | None,
        message: str) -> None:
    deployed(env)
    before = env.snapshot()
    r = env.client.request(method, url, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"]
    assert error["param"] == param
    assert env.snapshot() == before
    # the same API still takes a good request right after
    good = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2", **FAST})
    assert good.status_code == 201, good.text


def test_announcing_the_same_version_twice_is_409(env: Env) -> None:
    path = package_dir(env.tmp, "iris", "1")
    assert env.client.post("/v1/packages", json={"path": path}).status_code == 201
    r = env.client.post("/v1/packages", json={"path": path})
    assert r.status_code == 409 and r.json()["error"]["param"] == "version"
    assert len(env.store.list_packages()) == 1


def test_invalid_manifest_is_400_naming_the_field(env: Env) -> None:
    path = package_dir(env.tmp, "iris", "1", max_batch_size=-3)
    r = env.client.post("/v1/packages", json={"path": path})
    assert r.status_code == 400
    assert "max_batch_size" in r.json()["error"]["message"]
    assert env.store.list_packages() == []


def test_openapi_documents_every_route(env: Env) -> None:
    paths = env.client.get("/openapi.json").json()["paths"]
    assert {"/v1/packages", "/v1/rollouts", "/v1/rollouts/{rollout_id}",
            "/v1/models/{model}/rollback", "/v1/status",
            "/v1/deployments/{model}/{version}/scaling", "/v1/events"} <= set(paths)
    limit = {p["name"]: p for p in paths["/v1/events"]["get"]["parameters"]}["limit"]
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 1000)


def test_events_show_each_rollout_step_newest_first(env: Env) -> None:
    deployed(env)
    env.client.post("/v1/packages", json={"path": package_dir(env.tmp, "rose", "1")})
    rid = env.client.post("/v1/rollouts", json={"model": "iris", "version": "2",
                                                "stages": [50, 100], **FAST}).json()["id"]
    env.run_until_done()
    events = env.client.get("/v1/events", params={"model": "iris"}).json()
    assert all(e["model"] == "iris" for e in events)
    assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)
    steps = [e for e in events if e["message"].startswith(f"rollout {rid}: ")]
    notes = [s.note for s in env.store.rollout_steps(rid)]
    # every step of the rollout is an event, in the order taken, newest first
    assert [e["message"] for e in steps if e["kind"].startswith("rollout.")] == [
        f"rollout {rid}: {note}" for note in reversed(notes)]
    assert steps[0]["kind"] == "rollout.done" and "draining and stopping 1" in steps[0]["message"]
    assert events[-1]["kind"] == "announce" and events[-1]["message"].startswith("announced iris@1")
    assert events[0]["at"].endswith("+00:00")
    newest = env.client.get("/v1/events", params={"model": "iris", "limit": 2}).json()
    assert [e["id"] for e in newest] == [e["id"] for e in events[:2]]
    # paging: `before` the last id of a page gives the next page, with no gap or overlap
    pages = newest
    while True:
        page = env.client.get("/v1/events", params={"model": "iris", "limit": 2,
                                                    "before": pages[-1]["id"]}).json()
        if not page:
            break
        pages += page
    assert pages == events
    everything = env.client.get("/v1/events").json()
    assert any(e["model"] == "rose" for e in everything)
