"""A KServe request certain to be shed is answered from its head: the full path's 429, counted
the same, over a connection that stays usable; anything uncertain still takes the full path."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from podium.auth_keys import KeyConfig
from podium.gateway.asgi import Answer, Headers
from podium.gateway.early_shed import EarlyShed
from podium.gateway.http_server import bounded_head_protocol
from podium.gateway.limits import GatewayLimits
from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint, RouteTable, Saturated
from tests.support.polling import metric_sample
from tests.support.servers import Served, upstream

BOUND = 4
INFER = "/v2/models/iris/infer"
BODY = b'{"inputs": []}'


class Front:
    """A gateway whose HTTP protocol sheds early (in-flight bound 4), one iris@1 instance."""

    def __init__(self, instance_url: str, *, keys: KeyConfig | None = None) -> None:
        self.gateway = Gateway(limits=GatewayLimits(max_in_flight_per_instance=BOUND),
                               connect_timeout_s=1.0)
        self.endpoint = Endpoint("iris-1", instance_url)
        self.gateway.table.add_endpoint("iris", "1", self.endpoint)
        self.gateway.table.set_split("iris", {"1": 100})
        self.gateway.table.set_alias("iris", "latest", "1")
        access = keys.access() if keys is not None else None
        self.early: list[str] = []  # paths answered from the head
        shed = EarlyShed(self.gateway, access)

        def spied(method: str, path: str, headers: Headers) -> Answer | None:
            answer = shed(method, path, headers)
            if answer is not None:
                self.early.append(path)
            return answer

        app = self.gateway.app()
        if access is not None:
            from podium.auth import ApiKeyMiddleware
            app = ApiKeyMiddleware(app, access=access)
        self.served = Served(app, http=bounded_head_protocol(1 << 16, shed=spied))
        self.client = httpx.Client(base_url=self.served.url, timeout=10)

    def saturate(self, full: bool = True) -> None:
        """Fill the instance's bound with other gateways' requests (or free it)."""
        self.endpoint.in_flight_elsewhere = BOUND if full else 0

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.served.port), timeout=5)

    def close(self) -> None:
        self.client.close()
        self.served.stop()


def post(path: str = INFER, body: bytes = BODY, *, version: str = "1.1",
         headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/{version}", "host: gateway", "content-type: application/json",
             f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_answer(conn: socket.socket, pending: bytearray) -> tuple[int, dict[str, str], bytes]:
    """The next whole answer on `conn` (status, headers, body); `pending` keeps what follows."""
    while b"\r\n\r\n" not in pending:
        chunk = conn.recv(65536)
        assert chunk, "the gateway closed the connection before answering"
        pending += chunk
    head, _, _ = bytes(pending).partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 100 "):  # an interim answer: the final one follows
        del pending[:len(head) + 4]
        return read_answer(conn, pending)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":")
                                                            for line in lines[1:])}
    end = len(head) + 4 + int(headers["content-length"])
    while len(pending) < end:
        chunk = conn.recv(65536)
        assert chunk, "the gateway closed the connection mid-answer"
        pending += chunk
    body = bytes(pending[len(head) + 4:end])
    del pending[:end]
    return int(lines[0].split(" ", 2)[1]), headers, body


@pytest.fixture(scope="module")
def instance() -> Iterator[Served]:
    served = Served(upstream("1"))
    yield served
    served.stop()


@pytest.fixture
def front(instance: Served) -> Iterator[Front]:
    f = Front(instance.url)
    yield f
    f.close()


def test_a_certain_shed_is_the_full_paths_429_counted_the_same(front: Front) -> None:
    front.saturate()
    early = front.client.post(INFER, content=BODY)
    assert front.early == [INFER]
    # the same refusal through the full path (OpenAI: the model is in the body)
    full = front.client.post("/v1/chat/completions", json={"model": "iris", "messages": []})
    assert front.early == [INFER]
    assert early.status_code == full.status_code == 429
    assert early.headers["retry-after"] == full.headers["retry-after"] == "1"
    assert early.headers["content-type"] == "application/json"
    assert "date" in early.headers and "server" in early.headers  # as uvicorn writes them
    assert early.json()["error"] == (f"every instance of iris@1 has {BOUND} requests in flight "
                                     f"(--max-in-flight-per-instance, {BOUND} of them from "
                                     "other gateways); retry in 1 s")
    assert front.endpoint.num_in_flight == 0  # never started
    assert metric_sample(front.client, "podium:gateway_shed_total", model="iris", version="1",
                         by="gateway") == 2
    health = front.gateway.stats.health("iris", "1", since_ms=0)
    assert (health.num_requests, health.num_errors) == (0, 0)  # no evidence for the analysis
    front.saturate(False)
    served = front.client.post(INFER, content=BODY)
    assert served.status_code == 200 and served.json()["version"] == "1"
    assert front.early == [INFER]


@pytest.mark.parametrize("path", ["/pipelines/iris", "/pipelines/iris/versions/1",
                                  "/pipelines/iris/versions/latest"])
def test_a_pipeline_request_is_shed_from_its_head_before_its_body_is_read(
        front: Front, path: str) -> None:
    front.saturate()
    pending = bytearray()
    with front.connect() as conn:
        # a body that is not even JSON: the head alone decides, so it is never parsed
        status, headers, body = read_answer_after(conn, pending, post(path, b"{not json"))
        assert (status, headers["retry-after"]) == (429, "1"), body
        assert b"every instance of iris@1 has 4 requests in flight" in body
        assert front.endpoint.num_in_flight == 0  # never forwarded
        # the same connection serves the next, good request once there is room
        front.saturate(False)
        status, _, body = read_answer_after(conn, pending, post(path, b'{"member_id": "m1"}'))
        assert status == 200 and b'"version":"1"' in body.replace(b" ", b""), body
    assert front.early == [path]
    assert metric_sample(front.client, "podium:gateway_shed_total", model="iris", version="1",
                         by="gateway") == 1


def test_a_path_beyond_a_pipeline_route_is_not_shed_early(front: Front) -> None:
    front.saturate()
    answer = front.client.post("/pipelines/iris/infer", content=b"{}")
    assert answer.status_code == 404 and front.early == []  # the full path's answer


def test_the_connection_stays_open_for_the_next_request_pipelined_or_not(front: Front) -> None:
    front.saturate()
    pending = bytearray()
    with front.connect() as conn:
        conn.sendall(post())
        assert read_answer(conn, pending)[0] == 429
        # two in one write: both shed, answered in order on the same connection
        conn.sendall(post() + post("/v2/models/iris/versions/1/infer"))
        assert [read_answer(conn, pending)[0] for _ in range(2)] == [429, 429]
        front.saturate(False)
        # a shed one pipelined before one that is served: each gets its own answer, in order
        conn.sendall(post() + post())
        statuses = [read_answer(conn, pending)[0] for _ in range(2)]
        assert statuses == [200, 200]
        front.saturate()
        # a body sent in pieces is read to its end (dropped) before the answer
        request = post(body=b'{"inputs": [' + b" " * 5000 + b"]}")
        head, body = request[:-3000], request[-3000:]
        conn.sendall(head)
        time.sleep(0.05)  # two reads at the gateway
        conn.sendall(body)
        assert read_answer(conn, pending)[0] == 429
        front.saturate(False)
        status, _, answer = read_answer_after(conn, pending, post())
        assert status == 200 and b'"version"' in answer
    assert len(front.early) == 4


def read_answer_after(conn: socket.socket, pending: bytearray,
                      request: bytes) -> tuple[int, dict[str, str], bytes]:
    conn.sendall(request)
    return read_answer(conn, pending)


def test_http_1_0_is_answered_then_closed(front: Front) -> None:
    front.saturate()
    pending = bytearray()
    with front.connect() as conn:
        conn.sendall(post(version="1.0"))
        status, headers, _ = read_answer(conn, pending)
        assert status == 429 and headers["connection"] == "close"
        assert conn.recv(1) == b""  # closed by the gateway
    assert front.early == [INFER]


@pytest.mark.parametrize("case", ["openai", "expect-100", "percent-path", "body-over-limit",
                                  "get", "room-left"])
def test_what_is_not_certain_takes_the_full_path(front: Front, case: str) -> None:
    front.saturate(case != "room-left")
    pending = bytearray()
    with front.connect() as conn:
        if case == "openai":
            request = post("/v1/completions", b'{"model": "iris", "prompt": "x"}')
        elif case == "expect-100":
            request = post(headers={"expect": "100-continue"})
        elif case == "percent-path":
            request = post("/v2/models/ir%69s/infer")
        elif case == "body-over-limit":
            request = (b"POST " + INFER.encode() + b" HTTP/1.1\r\nhost: g\r\ncontent-length: "
                       + str(front.gateway.limits.max_body_bytes + 1).encode() + b"\r\n\r\n")
        elif case == "get":
            request = b"GET /v2/models/iris HTTP/1.1\r\nhost: g\r\n\r\n"
        else:
            request = post()
        conn.sendall(request)
        status, _, body = read_answer(conn, pending)
    # the full path sheds what it would forward (a GET too); it reads a body before its limit
    expected = {"body-over-limit": 413, "room-left": 200}.get(case, 429)
    assert status == expected, body
    assert front.early == []


def test_a_request_whose_key_does_not_pass_gets_its_401_first(instance: Served) -> None:
    front = Front(instance.url, keys=KeyConfig(api_keys=("k1", "k2")))
    try:
        front.saturate()
        assert front.client.post(INFER, content=BODY).status_code == 401
        wrong = front.client.post(INFER, content=BODY, headers={"authorization": "Bearer k3"})
        assert wrong.status_code == 401
        assert front.early == []
        for key in ("k1", "k2"):
            shed = front.client.post(INFER, content=BODY,
                                     headers={"authorization": f"Bearer {key}"})
            assert shed.status_code == 429
        assert front.early == [INFER, INFER]
    finally:
        front.close()


def _split_table() -> tuple[RouteTable, tuple[Endpoint, Endpoint, Endpoint]]:
    """Model m: v1 on instances 1-a and 1-b, v2 on 2-a, a 50/50 split, `latest` = v1."""
    table = RouteTable()
    endpoints = tuple(Endpoint(f"{v}", f"http://127.0.0.1:{9000 + i}") for i, v in
                      enumerate(("1-a", "1-b", "2-a")))
    for endpoint in endpoints:
        table.add_endpoint("m", endpoint.id[0], endpoint)
    table.set_split("m", {"1": 50, "2": 50})
    table.set_alias("m", "latest", "1")
    return table, endpoints  # type: ignore[return-value]


def test_saturated_is_certain_and_turns_no_round_robin() -> None:
    def saturated(table: RouteTable, *args: object) -> bool:
        return table.saturation(*args) is not None  # type: ignore[arg-type]

    table, (a, b, c) = _split_table()
    full = {"1-a", "1-b"}

    def has_room(endpoint: Endpoint) -> bool:
        return endpoint.id not in full

    assert saturated(table, "m", "1", has_room)
    assert saturated(table, "m", "latest", has_room)  # an alias resolves
    assert not saturated(table, "m", "2", has_room)
    assert not saturated(table, "m", None, has_room)  # the split may still pick v2
    c.healthy = False  # v2 takes nothing now: the split can only pick v1
    assert saturated(table, "m", None, has_room)
    a.healthy = b.healthy = False  # no ready instance at all: that is no shed
    assert not saturated(table, "m", None, has_room)
    assert not saturated(table, "other", None, has_room)
    a.healthy = b.healthy = c.healthy = True
    full.clear()
    picks = [table.resolve("m", None)[0] for _ in range(4)]
    saturated(table, "m", None, has_room)  # once: a turn would shift the alternation
    assert [table.resolve("m", None)[0] for _ in range(4)] == picks  # the same turn of the WRR


def test_saturation_names_the_version_and_instance_only_where_one_could_be_picked() -> None:
    table, (a, b, c) = _split_table()
    a.num_in_flight, b.num_in_flight, c.num_in_flight = 3, 2, 2

    def has_room(endpoint: Endpoint) -> bool:
        return endpoint.id == "2-a"

    assert table.saturation("m", "latest", has_room) == Saturated("1", b)  # least load
    assert table.saturation("m", None, has_room) is None  # the split may pick v2
    c.healthy = False  # only v1 can be picked now: certain which
    assert table.saturation("m", None, has_room) == Saturated("1", b)
    c.healthy = True
    assert table.saturation("m", None, lambda e: False) == Saturated(None, None)  # split: which?
    assert table.saturation("m", "3", lambda e: False) is None  # not served: no shed
    table.set_adapter("sql", "m", "1", True)  # its base version follows a split of its own
    assert table.saturation("sql", "1", lambda e: False) == Saturated(None, None)


def test_a_shed_across_a_split_is_counted_for_the_version_the_split_picks(
        instance: Served) -> None:
    front = Front(instance.url)
    try:
        other = Endpoint("iris-2", instance.url, in_flight_elsewhere=BOUND)
        front.gateway.table.add_endpoint("iris", "2", other)
        front.gateway.table.set_split("iris", {"1": 50, "2": 50})
        front.saturate()
        statuses = [front.client.post(INFER, content=BODY).status_code for _ in range(4)]
        assert statuses == [429] * 4 and front.early == [INFER] * 4
        shed = front.gateway.stats.shed
        assert (shed[("iris", "1", "gateway")], shed[("iris", "2", "gateway")]) == (2, 2)
        front.saturate(False)  # v1 has room again: the split still alternates
        versions = [front.client.post(INFER, content=BODY).status_code for _ in range(2)]
        assert versions.count(200) == 1 and versions.count(429) == 1
    finally:
        front.close()


async def test_requests_let_through_in_one_turn_count_against_the_bound_until_it_ends() -> None:
    """Several heads parsed in one turn of the loop all see the room the first one saw (a
    request is counted in flight only once its task runs, the turn after): the check counts
    those it let through, so the one past the bound is refused from its head, not through
    the app; once the turn is over the count is the instance's own again."""
    gateway = Gateway(limits=GatewayLimits(max_in_flight_per_instance=BOUND))
    endpoint = Endpoint("iris-1", "http://127.0.0.1:9")
    gateway.table.add_endpoint("iris", "1", endpoint)
    gateway.table.set_split("iris", {"1": 100})
    shed = EarlyShed(gateway)
    head: Headers = [(b"content-length", str(len(BODY)).encode())]
    assert [shed("POST", INFER, head) for _ in range(BOUND)] == [None] * BOUND
    refused = shed("POST", INFER, head)  # the bound's worth went to the app in this turn
    assert refused is not None and refused.status == 429
    assert gateway.stats.shed[("iris", "1", "gateway")] == 1
    await asyncio.sleep(0)  # the turn ended (their tasks would have run)
    assert shed("POST", INFER, head) is None  # nothing in flight: room again
    endpoint.num_in_flight = BOUND - 1  # one left: one more goes, the next is refused
    await asyncio.sleep(0)
    assert shed("POST", INFER, head) is None
    assert shed("POST", INFER, head) is not None
