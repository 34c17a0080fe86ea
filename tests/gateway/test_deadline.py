"""The time a request spends in the gateway is subtracted from its deadline: the instance gets
X-Request-Timeout minus what the gateway spent (routing, a wait for a cold start); when
nothing is left the gateway answers 504 naming the header and sends nothing. A bad header is
a 400 naming it. Each followed by a good request. (Over gRPC the upstream call's timeout was
already what is left of the client's; grpc itself cancels a call held past its deadline.)"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from podium.gateway.hold import Hold
from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.support.polling import eventually
from tests.support.servers import Served


def _instance() -> Starlette:
    """An instance stand-in that answers with the X-Request-Timeout it was sent."""
    seen: list[str | None] = []

    async def infer(request: Request) -> Response:
        await request.body()
        seen.append(request.headers.get("x-request-timeout"))
        return JSONResponse({"timeout": seen[-1]})

    app = Starlette(routes=[Route("/{path:path}", infer, methods=["POST"])])
    app.state.seen = seen
    return app


@pytest.fixture(scope="module")
def instance() -> Iterator[Served]:
    served = Served(_instance())
    yield served
    served.stop()


class Front:
    """A gateway on loopback in front of `iris@1`, started on demand (no instance yet)."""

    def __init__(self) -> None:
        self.gateway = Gateway(connect_timeout_s=1.0,
                               hold=Hold(max_held=4, max_wait_s=30, poll_s=0.01))
        self.table = self.gateway.table
        self.table.set_split("iris", {"1": 100})
        self.table.set_on_demand("iris", "1", True)
        self.served = Served(self.gateway.app())
        self.client = httpx.Client(base_url=self.served.url, timeout=30)

    def infer(self, timeout: str | None) -> httpx.Response:
        headers = {"X-Request-Timeout": timeout} if timeout is not None else {}
        return self.client.post("/v2/models/iris/infer", json={"inputs": []}, headers=headers)

    def close(self) -> None:
        self.client.close()
        self.served.stop()


@pytest.fixture
def front() -> Iterator[Front]:
    f = Front()
    yield f
    f.close()


def test_a_cold_start_wait_ends_at_the_deadline_with_504(front: Front,
                                                          instance: Served) -> None:
    r = front.infer("0.3")  # no instance will come in time
    assert r.status_code == 504, r.text
    assert "X-Request-Timeout" in r.json()["error"] and "to start" in r.json()["error"]
    assert instance.app.state.seen == []  # never sent
    front.table.add_endpoint("iris", "1", Endpoint("iris-1", instance.url))
    assert front.infer("30").status_code == 200


def test_the_instance_gets_what_is_left_of_the_deadline(front: Front, instance: Served) -> None:
    front.table.add_endpoint("iris", "1", Endpoint("iris-1", instance.url))
    r = front.infer("10")
    assert r.status_code == 200, r.text
    left = float(r.json()["timeout"])
    assert 0 < left < 10, left  # the gateway's own time is gone
    assert front.infer(None).json()["timeout"] is None  # no deadline, none forwarded


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e12", "soon", ""],
                         ids=["negative", "nan", "infinite", "huge", "words", "empty"])
def test_a_bad_header_is_a_400_naming_it_then_good(front: Front, instance: Served,
                                                   value: str) -> None:
    front.table.add_endpoint("iris", "1", Endpoint("iris-1", instance.url))
    r = front.infer(value)
    assert r.status_code == 400, r.text
    assert "X-Request-Timeout" in r.json()["error"]
    assert front.infer("30").status_code == 200


def test_a_held_openai_request_gets_the_openai_shape(front: Front, instance: Served) -> None:
    r = front.client.post("/v1/chat/completions", headers={"X-Request-Timeout": "0.2"},
                          json={"model": "iris", "messages": []})
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["param"] == "X-Request-Timeout" and error["type"] == "timeout_error"
    assert eventually(lambda: front.gateway.hold.counts() == {})
    front.table.add_endpoint("iris", "1", Endpoint("iris-1", instance.url))
    assert json.loads(front.infer("30").text)["timeout"] is not None

