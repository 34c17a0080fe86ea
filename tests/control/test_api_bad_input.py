"""The control API at its edges: odd ids, wrong types, odd paths and odd bodies are a 4xx that
names the field or the limit, change nothing, and the same app serves the next good request."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from podium.control.api import create_app
from podium.control.api_limits import DEFAULT_MAX_HEADER_BYTES, MAX_JSON_DEPTH
from podium.edge.head import bounded_head_protocol
from tests.support.control_api import FAST, Env, deployed, package_dir
from tests.support.servers import Served

JSON = {"content-type": "application/json"}
GOOD_DEPLOY = {"model": "iris", "version": "2", **FAST}


def _raw(body: bytes, **headers: str) -> dict[str, Any]:
    return {"content": body, "headers": {**JSON, **headers}}


def _nested(depth: int) -> Any:
    value: Any = 100
    for _ in range(depth):
        value = [value]
    return value


# (method, url, request kwargs, status, param, words the message must contain)
EDGES: list[tuple[str, str, dict[str, Any], int, str | None, str]] = [
    ("get", "/v1/rollouts/" + "9" * 40, {}, 400, "rollout_id",
     "less than or equal to 2147483647"),
    ("get", f"/v1/rollouts/{2**63}", {}, 400, "rollout_id", "less than or equal to 2147483647"),
    ("get", "/v1/rollouts/0", {}, 400, "rollout_id", "greater than or equal to 1"),
    ("get", "/v1/rollouts/true", {}, 400, "rollout_id", "valid integer"),
    ("put", "/v1/deployments/iris/1/scaling",
     {"json": {"min_instances": True, "max_instances": 2}}, 400, "min_instances",
     "valid integer (got True)"),
    ("put", "/v1/deployments/iris/1/scaling",
     {"json": {"min_instances": "1", "max_instances": 2}}, 400, "min_instances",
     "valid integer (got '1')"),
    ("put", "/v1/deployments/iris/1/scaling",
     {"json": {"min_instances": -1, "max_instances": 2}}, 400, "min_instances",
     "min_instances=-1 is out of range; use 0..64"),
    ("put", "/v1/deployments/iris/1/scaling",
     {"json": {"min_instances": 1, "max_instances": 10**30}}, 400, "max_instances",
     "out of range"),
    ("put", "/v1/deployments/iris/" + "1" * 200 + "/scaling",
     {"json": {"min_instances": 1, "max_instances": 2}}, 400, "version", "at most 63"),
    ("post", "/v1/rollouts", {"json": {**GOOD_DEPLOY, "num_instances": True}}, 400,
     "num_instances", "valid integer (got True)"),
    ("post", "/v1/rollouts", {"json": {**GOOD_DEPLOY, "stages": [True, 100]}}, 400,
     "stages.0", "valid integer (got True)"),
    ("post", "/v1/rollouts", {"json": {**GOOD_DEPLOY, "stages": list(range(1, 102))}}, 400,
     "stages", "at most 100 items"),
    ("post", "/v1/rollouts", {"json": {**GOOD_DEPLOY, "ready_timeout_ms": 10**40}}, 400,
     "ready_timeout_ms", "out of range"),
    ("post", "/v1/rollouts", {"json": {**GOOD_DEPLOY, "model": "i" * 5000}}, 400, "model",
     "characters)"),
    ("post", "/v1/rollouts", _raw(b'{"model": "iris", "version": "2", "max_p99_ratio": NaN}'),
     400, None, "NaN is not a JSON number"),
    ("post", "/v1/rollouts", _raw(b"[" * 5000 + b"]" * 5000), 400, None,
     f"nested deeper than {MAX_JSON_DEPTH} levels"),
    ("post", "/v1/rollouts", {"json": {**GOOD_DEPLOY, "stages": _nested(MAX_JSON_DEPTH)}}, 400,
     None, f"nested {MAX_JSON_DEPTH + 1} levels deep; the limit is {MAX_JSON_DEPTH}"),
    ("post", "/v1/packages", _raw(b'{"path": "/tmp/\xff\xfe"}'), 400, None,
     "not UTF-8 (byte 0xff at offset 15)"),
    ("post", "/v1/rollouts", _raw(b'{"model": "iris",'), 400, None, "not valid JSON"),
    ("post", "/v1/rollouts", {"content": json.dumps(GOOD_DEPLOY).encode(),
                              "headers": {"content-type": "text/plain"}}, 400, "Content-Type",
     "send the body with Content-Type: application/json"),
    ("post", "/v1/rollouts", _raw(gzip.compress(json.dumps(GOOD_DEPLOY).encode()),
                                  **{"content-encoding": "gzip"}), 400, "Content-Encoding",
     "send it uncompressed"),
    ("post", "/v1/rollouts", _raw(b" " * (1024 * 1024 + 1)), 413, "Content-Length",
     "exceeds the control API's 1048576-byte limit (podium up --api-max-body-bytes)"),
    ("post", "/v1/rollouts", _raw(b"{}", **{"content-length": "2x"}), 400, "Content-Length",
     "is not a byte count"),
    ("post", "/v1/packages", {"json": {"path": "relative/pkg"}}, 400, "path", "is relative"),
    ("post", "/v1/packages", {"json": {"path": "/tmp/a\x00b"}}, 400, "path", "NUL byte"),
    ("post", "/v1/packages", {"json": {"path": "/" + "a" * 5000}}, 400, "path",
     "at most 4096 characters"),
    ("post", "/v1/packages", {"json": {"path": "/" + "a" * 300}}, 400, "path",
     "File name too long"),
    ("post", "/v1/packages", {"json": {"path": "{tmp}/pipe"}}, 400, "path", "is a FIFO"),
    ("post", "/v1/packages", {"json": {"path": "/dev/null"}}, 400, "path",
     "is a character device"),
    ("post", "/v1/packages", {"json": {"path": 7}}, 400, "path", "valid string"),
    ("get", "/v1/events?limit=0", {}, 400, "limit", "greater than or equal to 1"),
    ("get", "/v1/events?limit=1001", {}, 400, "limit", "less than or equal to 1000"),
    ("get", "/v1/events?limit=true", {}, 400, "limit", "valid integer"),
    ("get", "/v1/events?model=Not%20A%20Name", {}, 400, "model", "should match pattern"),
    ("get", f"/v1/events?before={2**40}", {}, 400, "before", "less than or equal to 2147483647"),
    ("get", "/v1/events?modle=iris", {}, 400, "modle",
     "query parameter 'modle' is not known; use before, limit, model"),
    ("get", "/v1/status?verbose=1", {}, 400, "verbose", "this route takes none"),
]
IDS = ["huge-rollout-id", "int64-overflow-id", "zero-id", "boolean-id", "boolean-count",
       "string-count", "negative-count", "huge-count", "long-version", "boolean-instances",
       "boolean-stage", "too-many-stages", "huge-timeout", "long-model", "nan", "deep-array",
       "deep-field", "non-utf8", "truncated-json", "text-plain", "gzip-body", "over-body-limit",
       "bad-content-length", "relative-path", "nul-in-path", "path-over-4096",
       "path-name-too-long", "fifo", "device", "path-not-string", "events-limit-zero",
       "events-limit-huge", "events-limit-boolean", "events-bad-model", "events-huge-before",
       "misspelt-query", "query-on-a-route-without-any"]


@pytest.mark.parametrize(("method", "url", "kwargs", "status", "param", "message"), EDGES,
                         ids=IDS)
def test_bad_edge_is_a_4xx_naming_it_then_a_good_request_works(
        env: Env, method: str, url: str, kwargs: dict[str, Any], status: int,
        param: str | None, message: str) -> None:
    deployed(env)
    os.mkfifo(env.tmp / "pipe")
    if "json" in kwargs and isinstance(kwargs["json"].get("path"), str):
        kwargs = {"json": {"path": kwargs["json"]["path"].replace("{tmp}", str(env.tmp))}}
    before = env.snapshot()
    r = env.client.request(method, url, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"]
    assert error["param"] == param
    assert env.snapshot() == before
    good = env.client.post("/v1/rollouts", json=GOOD_DEPLOY)
    assert good.status_code == 201, good.text


def test_headers_over_the_limit_are_431_then_a_good_request_works(env: Env) -> None:
    """The head is bounded by the HTTP protocol `podium up` serves the API with, so this needs
    a real server."""
    deployed(env)
    served = Served(create_app(env.plane), http=bounded_head_protocol(
        DEFAULT_MAX_HEADER_BYTES, server="the control API", flag="--api-max-header-bytes"))
    try:
        with httpx.Client(base_url=served.url) as client:
            before = env.snapshot()
            r = client.get("/v1/status", headers={"x-pad": "a" * 40_000})
            assert r.status_code == 431, r.text
            assert ("exceed the control API's limit of 32768 bytes (--api-max-header-bytes)"
                    in r.json()["error"]["message"])
            assert env.snapshot() == before
            good = client.post("/v1/rollouts", json=GOOD_DEPLOY)
            assert good.status_code == 201, good.text
    finally:
        served.stop()


def test_a_lower_body_limit_names_its_value(env: Env) -> None:
    client = TestClient(create_app(env.plane, max_body_bytes=2048))
    deployed(env)
    r = client.post("/v1/rollouts", json={**GOOD_DEPLOY, "pad": "x" * 3000})
    assert r.status_code == 413
    assert "request body of 3" in r.json()["error"]["message"]
    assert "2048-byte limit" in r.json()["error"]["message"]
    assert client.post("/v1/rollouts", json=GOOD_DEPLOY).status_code == 201


def test_a_chunked_body_over_the_limit_is_413_without_content_length(
        env: Env) -> None:
    client = TestClient(create_app(env.plane, max_body_bytes=2048))
    deployed(env)
    r = client.post("/v1/rollouts", content=iter([b'{"model": "', b"i" * 3000, b'"}']),
                    headers=JSON)
    assert r.status_code == 413, r.text
    assert "exceeds the control API's 2048-byte limit" in r.json()["error"]["message"]
    assert client.post("/v1/rollouts", json=GOOD_DEPLOY).status_code == 201


def test_package_roots_refuse_a_package_elsewhere(env: Env, tmp_path: Path) -> None:
    inside, outside = tmp_path / "roots", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    client = TestClient(create_app(env.plane, package_roots=(inside,)))
    r = client.post("/v1/packages", json={"path": package_dir(outside, "iris", "1")})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "path"
    assert "outside the package roots" in r.json()["error"]["message"]
    assert env.store.list_packages() == []
    # a symlink inside a root that points outside it is outside too
    (inside / "link").symlink_to(outside / "iris-1")
    assert client.post("/v1/packages", json={"path": str(inside / "link")}).status_code == 400
    r = client.post("/v1/packages", json={"path": package_dir(inside, "iris", "1")})
    assert r.status_code == 201, r.text
