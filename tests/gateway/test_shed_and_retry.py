"""Shedding and canary retry through the real HTTP gateway, against loopback stand-ins."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from podium.gateway.limits import GatewayLimits
from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.support.polling import async_eventually, eventually, metric_sample
from tests.support.servers import Dropper, RawServer, Served, upstream


def refusing(status: int, *, streamed: bool = False) -> Starlette:
    """An instance that answers every request with `status` (429 says when to come back)."""
    count = {"requests": 0}

    async def answer(_request: Request) -> Response:
        count["requests"] += 1
        headers = {"retry-after": "3"} if status == 429 else {}
        if streamed:  # no Content-Length: the gateway relays it rather than reading it whole
            async def body() -> Iterator[bytes]:
                yield b'{"error": "boom"}'
            return StreamingResponse(body(), status_code=status, headers=headers)
        return JSONResponse({"error": f"status {status}"}, status_code=status, headers=headers)

    app = Starlette(routes=[Route("/{path:path}", answer, methods=["POST"])])
    app.state.count = count
    return app


class BrokenStream(RawServer):
    """Starts a 200 event stream, sends one event, then closes the connection."""

    def answer(self, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
        time.sleep(0.2)


class Front:
    """A gateway (in-flight bound 2) on loopback, its client, and a stable v1 instance."""

    def __init__(self, v1: Served) -> None:
        self.gateway = Gateway(connect_timeout_s=1.0,
                               limits=GatewayLimits(max_in_flight_per_instance=2))
        self.table = self.gateway.table
        self.stable = Endpoint("iris-1-a", v1.url)
        self.table.add_endpoint("iris", "1", self.stable)
        self.table.set_alias("iris", "latest", "1")
        self.served = Served(self.gateway.app())
        self.client = httpx.Client(base_url=self.served.url, timeout=10)

    def canary(self, url: str, **options: bool) -> Endpoint:
        """Route 50% to a v2 instance at `url` (a rollout's stage)."""
        endpoint = Endpoint("iris-2-a", url, **options)
        self.table.add_endpoint("iris", "2", endpoint)
        self.table.set_split("iris", {"1": 50, "2": 50})
        return endpoint

    def infer(self, path: str = "/v2/models/iris/infer") -> httpx.Response:
        return self.client.post(path, json={"inputs": []})

    def metric(self, name: str, **labels: str) -> float | None:
        return metric_sample(self.client, name, **labels)

    def close(self) -> None:
        self.client.close()
        self.served.stop()


@pytest.fixture(scope="module")
def v1() -> Iterator[Served]:
    served = Served(upstream("1"))
    yield served
    served.stop()


@pytest.fixture
def front(v1: Served) -> Iterator[Front]:
    f = Front(v1)
    f.table.set_split("iris", {"1": 100})
    yield f
    f.close()


def holding(release: threading.Event) -> Starlette:
    """An instance that answers 200 once the test sets `release` (10 s at most)."""
    async def answer(_request: Request) -> Response:
        await asyncio.to_thread(release.wait, 10)
        return JSONResponse({"outputs": []})

    return Starlette(routes=[Route("/{path:path}", answer, methods=["POST"])])


def test_past_the_in_flight_bound_a_request_is_shed_at_once_and_counted() -> None:
    release = threading.Event()
    held = Served(holding(release))
    front = Front(held)
    front.table.set_split("iris", {"1": 100})
    try:
        slow = [threading.Thread(target=front.infer) for _ in range(2)]
        for thread in slow:
            thread.start()
        assert eventually(lambda: front.stable.num_in_flight == 2)
        shed = front.infer()
        # at once: answered while the test still holds both requests in flight, not queued
        # behind them (they end only when `release` is set, below)
        assert front.stable.num_in_flight == 2 and all(t.is_alive() for t in slow)
        assert shed.status_code == 429 and shed.headers["retry-after"] == "1"
        assert "every instance of iris@1 has 2 requests in flight" in shed.json()["error"]
        openai = front.client.post("/v1/chat/completions",
                                   json={"model": "iris", "messages": []})
        assert openai.status_code == 429 and openai.json()["error"]["type"] == "rate_limit_error"
        release.set()
        for thread in slow:
            thread.join(10)
        assert front.infer().status_code == 200  # room again: served
        assert front.metric("podium:gateway_shed_total", model="iris", version="1",
                            by="gateway") == 2
    finally:
        release.set()
        front.close()
        held.stop()
    # the analysis saw the 3 served requests, not the shed ones
    health = front.gateway.stats.health("iris", "1", since_ms=0)
    assert (health.num_requests, health.num_errors) == (3, 0)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_canary_5xx_is_answered_by_the_stable_version_and_still_counted(
        front: Front, streamed: bool) -> None:
    broken = Served(refusing(500, streamed=streamed))
    try:
        front.canary(broken.url)
        answers = [front.infer() for _ in range(6)]
        assert [(r.status_code, r.json()["version"]) for r in answers] == [(200, "1")] * 6
        assert broken.app.state.count["requests"] == 3  # half the split went to the canary
        assert eventually(lambda: front.gateway.stats.health("iris", "2", 0).num_requests == 3)
        canary = front.gateway.stats.health("iris", "2", since_ms=0)
        assert (canary.num_requests, canary.num_errors) == (3, 3)  # the analysis sees them
        assert front.metric("podium:gateway_retries_total", model="iris", version="2",
                            reason="canary") == 3
        # a client that named the canary gets its answer: there is nothing else it asked for
        assert front.infer("/v2/models/iris/versions/2/infer").status_code == 500
    finally:
        broken.stop()


def test_a_canary_that_drops_the_connection_after_the_request_is_resent_to_stable(
        front: Front) -> None:
    dropper = Dropper()
    try:
        front.canary(dropper.url)
        assert [front.infer().status_code for _ in range(4)] == [200] * 4
        assert dropper.num_requests == 2
        assert front.gateway.stats.health("iris", "2", since_ms=0).num_errors == 2
    finally:
        dropper.stop()


def test_a_package_that_is_not_idempotent_is_never_resent(front: Front) -> None:
    broken = Served(refusing(500))
    try:
        front.canary(broken.url, idempotent=False)
        assert sorted(front.infer().status_code for _ in range(4)) == [200, 200, 500, 500]
    finally:
        broken.stop()


def test_a_stream_that_already_started_is_not_resent(front: Front, v1: Served) -> None:
    stream = BrokenStream()
    try:
        front.canary(stream.url)
        front.table.set_split("iris", {"2": 100})
        seen = len(v1.app.state.seen)
        with pytest.raises(httpx.HTTPError):
            front.client.post("/v1/chat/completions", json={"model": "iris", "stream": True})
        assert len(v1.app.state.seen) == seen  # the client had a byte: nothing resent
        assert front.gateway.stats.health("iris", "2", since_ms=0).num_errors == 1
    finally:
        stream.stop()


def test_an_instance_429_goes_to_a_sibling_with_room_else_to_the_client(
        front: Front, v1: Served) -> None:
    full = Served(refusing(429))
    try:
        front.table.add_endpoint("iris", "1", Endpoint("iris-1-full", full.url))
        answers = [front.infer("/v2/models/iris/versions/1/infer") for _ in range(4)]
        assert [r.status_code for r in answers] == [200] * 4
        handed_on = full.app.state.count["requests"]
        assert handed_on >= 1
        front.stable.draining = True  # the only sibling takes nothing more
        relayed = front.infer("/v2/models/iris/versions/1/infer")
        assert relayed.status_code == 429 and relayed.headers["retry-after"] == "3"
        assert front.metric("podium:gateway_shed_total", model="iris", version="1",
                            by="instance") == 1
        assert front.metric("podium:gateway_retries_total", model="iris", version="1",
                            reason="overloaded") == handed_on
        assert front.gateway.stats.health("iris", "1", since_ms=0).num_errors == 0
    finally:
        full.stop()


def test_a_cancelled_request_gives_its_place_under_the_bound_back(v1: Served) -> None:
    async def cancel_one() -> int:
        gateway = Gateway(limits=GatewayLimits(max_in_flight_per_instance=1))
        endpoint = Endpoint("iris-1-a", v1.url)
        gateway.table.add_endpoint("iris", "1", endpoint)
        scope = {"type": "http", "method": "POST", "path": "/v2/models/iris/versions/1/slow",
                 "query_string": b"s=0.5", "headers": []}
        never = asyncio.Event()

        async def receive() -> dict:
            if scope.setdefault("read", False):
                await never.wait()
            scope["read"] = True
            return {"type": "http.request", "body": b"{}"}

        async def send(_message: dict) -> None:
            pass

        task = asyncio.create_task(gateway.handle(scope, receive, send))
        assert await async_eventually(lambda: endpoint.num_in_flight > 0)
        task.cancel()  # as a server shutting down, or a client's cancellation, does
        await asyncio.gather(task, return_exceptions=True)
        await gateway.aclose()
        return endpoint.num_in_flight

    # a leaked count would hold the only place for good: every later request shed
    assert asyncio.run(cancel_one()) == 0
