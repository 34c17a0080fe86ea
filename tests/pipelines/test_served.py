"""The real path without an engine: `podium serve --repository` of xgb-example beside the
`recommend` example (its control arm only, so no LLM), called over tritonclient HTTP and gRPC
and the plain JSON route; xgb-example is called in-process and really scores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from podium.examples.builders import write_xgb_example
from podium.examples.recommend import recommend_manifest, write_recommend_example
from podium.package.package import write_manifest
from tests.support.harness import RunningInstance, running_instance

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningInstance]:
    repository = tmp_path_factory.mktemp("pipeline-repository")
    write_xgb_example(repository / "xgb-example")
    write_recommend_example(repository / "recommend", "absent-llm")
    manifest = recommend_manifest("absent-llm")
    manifest["steps"] = [s for s in manifest["steps"] if s["name"] != "pick"]
    manifest["steps"][0]["variants"] = [{"name": "control", "weight": 1}]
    manifest["steps"][-1]["args"].pop("picked")
    manifest["trace_log"] = "steps.jsonl"
    write_manifest(repository / "recommend", manifest)
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    with running_instance(["--repository", str(repository)], log) as instance:
        instance.repository = repository  # type: ignore[attr-defined]
        yield instance


def _expected(repository: Path, member: str) -> list[str]:
    """The three titles of the member's genre xgb-example scores highest, computed here."""
    import sqlite3

    import xgboost

    with sqlite3.connect(repository / "recommend" / "catalog.db") as db:
        genre = db.execute("SELECT genre FROM members WHERE member_id = ?", (member,)
                           ).fetchone()[0]
        rows = db.execute("SELECT * FROM titles WHERE genre = ? LIMIT 12", (genre,)).fetchall()
    booster = xgboost.Booster(model_file=str(repository / "xgb-example" / "model.json"))
    scores = booster.inplace_predict(np.array([r[2:] for r in rows], dtype=np.float32))
    ranked = sorted(zip([r[0] for r in rows], scores.tolist(), strict=True),
                    key=lambda pair: -pair[1])
    return [title for title, _ in ranked[:3]]


def test_tritonclient_http_gets_the_ranked_titles_and_the_variant(served) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(served.http_url.removeprefix("http://"))
    member = httpclient.InferInput("member_id", [1], "BYTES")
    member.set_data_from_numpy(np.array([b"m5"], dtype=object))
    result = client.infer("recommend", [member])
    titles = [t.decode() for t in result.as_numpy("titles")]
    assert titles == _expected(served.repository, "m5")
    assert result.as_numpy("variant")[0] == b"control"
    assert result.get_response()["parameters"]["pipeline_path"] == "live"


def test_tritonclient_grpc_gets_the_same_answer(served) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(served.grpc_url)
    member = grpcclient.InferInput("member_id", [1], "BYTES")
    member.set_data_from_numpy(np.array([b"m6"], dtype=object))
    result = client.infer("recommend", [member])
    assert [t.decode() for t in result.as_numpy("titles")] == _expected(served.repository, "m6")
    assert result.as_numpy("ranked_by")[0] == b"xgb-example"


def test_the_json_route_answers_and_joins_the_callers_trace(served) -> None:
    traceparent = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"
    answer = httpx.post(f"{served.http_url}/pipelines/recommend", json={"member_id": "m7"},
                        headers={"traceparent": traceparent, "x-request-id": "rec-7"},
                        timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["outputs"]["titles"] == _expected(served.repository, "m7")
    assert body["variant"] == "control" and body["path"] == "live"
    assert body["trace_id"] == CALLER_TRACE and body["request_id"] == "rec-7"
    lines = [json.loads(line) for line in
             (served.repository / "recommend" / "steps.jsonl").read_text().splitlines()]
    mine = {line["step"]: line for line in lines if line["request_id"] == "rec-7"}
    assert set(mine) == {"arm", "member", "cands", "feats", "rank", "post"}
    assert mine["cands"]["sizes"]["items"] == 12


def test_a_bad_field_is_a_400_naming_it_then_a_good_request_answers(served) -> None:
    bad = httpx.post(f"{served.http_url}/pipelines/recommend", json={"member": "m1"},
                     timeout=30)
    assert bad.status_code == 400
    assert "'member' is not an input of 'recommend' (inputs: member_id)" in bad.json()["error"]
    good = httpx.post(f"{served.http_url}/pipelines/recommend", json={"member_id": "m1"},
                      timeout=30)
    assert good.status_code == 200


def test_an_unknown_parameter_is_a_400_naming_it_then_a_good_request_answers(served) -> None:
    body = {"inputs": [{"name": "member_id", "datatype": "BYTES", "shape": [1],
                        "data": ["m1"]}]}
    bad = httpx.post(f"{served.http_url}/v2/models/recommend/infer", timeout=30,
                     json={**body, "parameters": {"temperature": 0.5}})
    assert bad.status_code == 400
    assert "parameter 'temperature' is not honoured by a pipeline" in bad.json()["error"]
    traced = httpx.post(f"{served.http_url}/v2/models/recommend/infer", timeout=30, json={
        **body, "parameters": {"traceparent": f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"}})
    assert traced.status_code == 200
    assert traced.json()["parameters"]["pipeline_trace_id"] == CALLER_TRACE


def test_step_metrics_are_on_metrics(served) -> None:
    httpx.post(f"{served.http_url}/pipelines/recommend", json={"member_id": "m2"}, timeout=30)
    text = httpx.get(f"{served.http_url}/metrics", timeout=30).text
    assert ('podium:pipeline_step_total{outcome="ok",pipeline="recommend",step="rank",'
            'variant="control"}') in text
