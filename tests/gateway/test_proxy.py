"""The gateway against real upstream servers on loopback."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.support.polling import eventually
from tests.support.servers import Dropper, Served, Truncator, closed_port_url, upstream


@pytest.fixture(scope="module")
def v1() -> Iterator[Served]:
    served = Served(upstream("1"))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def v2() -> Iterator[Served]:
    served = Served(upstream("2"))
    yield served
    served.stop()


class Front:
    """A gateway served on loopback plus a client for it."""

    def __init__(self) -> None:
        self.gateway = Gateway(max_attempts=3, connect_timeout_s=1.0)
        self.table = self.gateway.table
        self.served = Served(self.gateway.app())
        self.client = httpx.Client(base_url=self.served.url, timeout=10)

    def close(self) -> None:
        self.client.close()
        self.served.stop()


@pytest.fixture
def front(v1: Served, v2: Served) -> Iterator[Front]:
    f = Front()
    f.table.add_endpoint("iris", "1", Endpoint("iris-1-a", v1.url))
    f.table.add_endpoint("iris", "2", Endpoint("iris-2-a", v2.url))
    f.table.set_split("iris", {"1": 100})
    f.table.set_alias("iris", "latest", "1")
    yield f
    f.close()


def test_kserve_path_routes_by_split_and_explicit_version(front: Front) -> None:
    r = front.client.post("/v2/models/iris/infer", json={"inputs": []}, params={"x": "1"})
    assert r.status_code == 200
    assert r.json() | {"body": None, "headers": None} == {
        "version": "1", "path": "/v2/models/iris/infer", "query": "x=1", "body": None,
        "auth": None, "headers": None}
    r = front.client.post("/v2/models/iris/versions/2/infer", json={})
    assert (r.json()["version"], r.json()["path"]) == ("2", "/v2/models/iris/versions/2/infer")


def test_latest_alias_in_the_path_is_resolved_before_forwarding(front: Front) -> None:
    front.table.set_alias("iris", "latest", "2")
    r = front.client.post("/v2/models/iris/versions/latest/infer", json={})
    assert r.json()["path"] == "/v2/models/iris/versions/2/infer"


def test_openai_model_at_version_routes_and_strips_the_version(front: Front) -> None:
    r = front.client.post("/v1/chat/completions", json={"model": "iris@2", "messages": []},
                          headers={"Authorization": "Bearer k"})
    body = r.json()
    assert (body["version"], body["body"]["model"], body["auth"]) == ("2", "iris", "Bearer k")
    r = front.client.post("/v1/completions", json={"model": "iris", "prompt": "hi"})
    assert (r.json()["version"], r.json()["body"]) == ("1", {"model": "iris", "prompt": "hi"})


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/invocations",
                                  "/v1/chat/completions/batch"])
def test_vllms_routes_outside_v1_route_by_their_model(front: Front, path: str) -> None:
    """`vllm serve`'s /tokenize, /detokenize, /invocations (and /v1/chat/completions/batch, a
    /v1 path) go through the gateway like /v1: by the body's `model` (which the gateway needs:
    it serves many models)."""
    r = front.client.post(path, json={"model": "iris@2", "prompt": "hi"})
    body = r.json()
    assert (body["path"], body["version"], body["body"]["model"]) == (path, "2", "iris")
    r = front.client.post(path, json={"prompt": "hi"})
    assert r.status_code == 400 and "field 'model' is required" in r.json()["error"]["message"]


def test_weighted_split_is_exact_and_changes_live(front: Front) -> None:
    front.table.set_split("iris", {"1": 90, "2": 10})
    got = Counter(front.client.post("/v2/models/iris/infer", json={}).json()["version"]
                  for _ in range(20))
    assert got == {"1": 18, "2": 2}
    front.table.set_split("iris", {"1": 0, "2": 100})
    got = Counter(front.client.post("/v2/models/iris/infer", json={}).json()["version"]
                  for _ in range(5))
    assert got == {"2": 5}


def test_a_refused_connection_is_retried_on_another_instance(front: Front) -> None:
    dead = Endpoint("iris-1-dead", closed_port_url())
    front.table.add_endpoint("iris", "1", dead)
    results = [front.client.post("/v2/models/iris/infer", json={}) for _ in range(6)]
    assert [r.status_code for r in results] == [200] * 6
    assert dead.healthy is False


def test_a_request_that_reached_the_instance_is_not_replayed(front: Front) -> None:
    dropper = Dropper()
    front.table.add_endpoint("iris", "3", Endpoint("iris-3-drop", dropper.url))
    try:
        r = front.client.post("/v2/models/iris/versions/3/infer", json={})
        assert r.status_code == 502
        assert "failed mid-request" in r.json()["error"]
        assert dropper.num_requests == 1
        assert eventually(lambda: front.gateway.stats.health("iris", "3", 0).num_requests == 1)
        health = front.gateway.stats.health("iris", "3", since_ms=0)
        assert (health.num_requests, health.num_errors) == (1, 1)
    finally:
        dropper.stop()


def test_sse_streams_through_event_by_event(front: Front) -> None:
    arrivals = []
    with front.client.stream("POST", "/v1/chat/completions/sse",
                             json={"model": "iris", "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic(), line[6:]))
    assert [a[1] for a in arrivals][-1] == "[DONE]"
    events = [json.loads(a[1]) for a in arrivals[:-1]]
    assert [e["i"] for e in events] == [0, 1, 2]
    # the first event reached the client long before the stream ended: not buffered
    assert arrivals[-1][0] - arrivals[0][0] > 0.5


def test_a_whole_answer_is_counted_before_the_client_has_it(front: Front) -> None:
    start = front.gateway.clock_ms()
    r = front.client.post("/v2/models/iris/versions/1/infer", json={})
    assert r.status_code == 200 and r.headers["content-length"] == str(len(r.content))
    # read whole from the instance: outcome and in-flight count settle before the answer goes
    health = front.gateway.stats.health("iris", "1", since_ms=start)
    assert (health.num_requests, health.num_errors) == (1, 0)
    assert front.table.endpoint("iris-1-a").num_in_flight == 0


def test_a_stream_is_in_flight_until_its_last_event(front: Front) -> None:
    endpoint = front.table.endpoint("iris-1-a")
    with front.client.stream("POST", "/v1/chat/completions/sse",
                             json={"model": "iris@1", "stream": True}) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert endpoint.num_in_flight == 1
        assert front.gateway.stats.health("iris", "1", since_ms=0).num_requests == 0
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    assert eventually(lambda: endpoint.num_in_flight == 0)
    assert eventually(lambda: front.gateway.stats.health("iris", "1", 0).num_requests == 1)
    assert front.gateway.stats.health("iris", "1", since_ms=0).num_errors == 0


def test_a_client_leaving_a_stream_closes_it_upstream(front: Front, v1: Served) -> None:
    streams = v1.app.state.streams
    closed_before = streams["closed_early"]
    endpoint = front.table.endpoint("iris-1-a")
    with front.client.stream("POST", "/v1/chat/completions/sse", params={"n": "100"},
                             json={"model": "iris@1", "stream": True}) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    # the client hung up with 30 s of events to go: the instance stops generating them
    assert eventually(lambda: streams["closed_early"] == closed_before + 1)
    assert eventually(lambda: endpoint.num_in_flight == 0)
    health = front.gateway.stats.health("iris", "1", since_ms=0)
    assert (health.num_requests, health.num_errors) == (1, 0)


@pytest.mark.parametrize("size", [10, 3 * 2**20], ids=["small", "3MiB"])
def test_a_body_without_a_length_is_relayed_complete(front: Front, size: int) -> None:
    r = front.client.post("/v2/models/iris/versions/1/chunked", params={"size": size}, json={})
    assert r.status_code == 200
    assert r.content == bytes(i % 251 for i in range(size))


def test_hop_by_hop_headers_stay_on_their_hop_and_none_are_invented(front: Front) -> None:
    r = front.client.post("/v2/models/iris/versions/1/infer", json={},
                          headers={"x-trace": "t1", "te": "trailers", "keep-alive": "5",
                                   "proxy-authorization": "Basic eDp5"})
    assert set(r.json()["headers"]) == {"accept", "accept-encoding", "content-length",
                                        "content-type", "host", "user-agent", "x-trace"}
    assert r.headers["x-answered-by"] == "1"
    assert "keep-alive" not in r.headers


def test_a_body_cut_short_is_a_502_and_counts_as_an_error(front: Front) -> None:
    truncator = Truncator()
    endpoint = Endpoint("iris-4-cut", truncator.url)
    front.table.add_endpoint("iris", "4", endpoint)
    try:
        r = front.client.post("/v2/models/iris/versions/4/infer", json={})
        assert r.status_code == 502
        assert "iris@4 failed mid-request" in r.json()["error"]
        health = front.gateway.stats.health("iris", "4", since_ms=0)
        assert (health.num_requests, health.num_errors, endpoint.num_in_flight) == (1, 1, 0)
    finally:
        truncator.stop()


def test_a_method_the_gateway_does_not_route_is_405(front: Front) -> None:
    r = front.client.request("TRACE", "/v2/models/iris/infer")
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_draining_instance_finishes_in_flight_and_takes_no_new_requests(
        front: Front, v1: Served) -> None:
    second = Endpoint("iris-1-b", v1.url)
    front.table.add_endpoint("iris", "1", second)
    first = front.table.endpoint("iris-1-a")
    out: dict[str, httpx.Response] = {}
    slow = threading.Thread(target=lambda: out.update(
        r=front.client.post("/v2/models/iris/versions/1/slow", params={"s": "2"}, json={})))
    slow.start()
    eventually(lambda: first.num_in_flight + second.num_in_flight > 0)
    busy = first if first.num_in_flight else second
    front.table.drain(busy.id)
    other = second if busy is first else first
    for _ in range(3):
        assert front.client.post("/v2/models/iris/versions/1/infer", json={}).status_code == 200
    assert eventually(lambda: other.num_in_flight == 0)
    assert busy.num_in_flight == 1  # the slow request is still being served
    slow.join()
    assert out["r"].status_code == 200
    assert eventually(lambda: busy.num_in_flight == 0)


@pytest.mark.parametrize(("method", "path", "body", "status", "message"), [
    ("POST", "/v2/models/ghost/infer", {}, 404, "model 'ghost' is not deployed"),
    ("POST", "/v2/models/iris/versions/9/infer", {}, 404, "iris@9 is not deployed"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "field 'model' is required"),
    ("POST", "/v1/chat/completions", {"model": "iris@"}, 400, "use name@version"),
    ("GET", "/elsewhere", None, 404, "is not routed by the gateway"),
], ids=["unknown-model", "unknown-version", "no-model-field", "empty-version", "unrouted-path"])
def test_bad_requests_are_answered_by_the_gateway(
        front: Front, method: str, path: str, body: dict | None, status: int,
        message: str) -> None:
    r = front.client.request(method, path, json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert message in (error["message"] if isinstance(error, dict) else error)


def test_no_ready_instance_is_503_and_health_ready_says_so(front: Front) -> None:
    for endpoint in front.table.endpoints():
        endpoint.healthy = False
    assert front.client.post("/v2/models/iris/infer", json={}).status_code == 503
    assert front.client.get("/health/ready").status_code == 503
    assert front.client.get("/health").status_code == 200


def test_upstream_errors_are_passed_through_and_counted(front: Front) -> None:
    start = front.gateway.clock_ms()
    r = front.client.post("/v2/models/iris/versions/2/fail", json={})
    assert r.status_code == 500 and r.json() == {"error": "boom"}
    front.client.post("/v2/models/iris/versions/2/infer", json={})
    assert eventually(
        lambda: front.gateway.stats.health("iris", "2", since_ms=start).num_requests == 2)
    health = front.gateway.stats.health("iris", "2", since_ms=start)
    assert (health.num_requests, health.num_errors) == (2, 1)
    assert health.p99_ms is not None and health.p99_ms > 0


def test_models_list_shows_names_and_versions(front: Front) -> None:
    ids = [m["id"] for m in front.client.get("/v1/models").json()["data"]]
    assert ids == ["iris", "iris@1", "iris@2"]


def test_metrics_count_requests_per_version_and_show_instances_and_splits(front: Front) -> None:
    front.table.set_split("iris", {"1": 75, "2": 25})
    for _ in range(4):
        front.client.post("/v2/models/iris/infer", json={})
    front.client.post("/v2/models/iris/versions/2/fail", json={})
    assert eventually(lambda: sample(front, "podium:gateway_requests_total", model="iris",
                                     version="2", outcome="error") == 1)
    r = front.client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    for version, outcome, count in (("1", "ok", 3), ("2", "ok", 1), ("2", "error", 1)):
        assert sample(front, "podium:gateway_requests_total", model="iris", version=version,
                      outcome=outcome) == count
    assert sample(front, "podium:gateway_request_seconds_count", model="iris",
                  version="2") == 2
    assert sample(front, "podium:gateway_request_seconds_sum", model="iris", version="2") > 0
    assert sample(front, "podium:gateway_instance_up", model="iris", version="1",
                  instance="iris-1-a") == 1
    assert sample(front, "podium:gateway_in_flight", model="iris", version="1",
                  instance="iris-1-a") == 0
    assert sample(front, "podium:gateway_split_weight", model="iris", version="2") == 25


def sample(front: Front, name: str, **labels: str) -> float | None:
    """The value of one sample on the gateway's /metrics, parsed as Prometheus parses it."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(front.client.get("/metrics").text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None
