"""The gateway's own HTTP/1.1 client for forwarded POSTs: one write per request, keep-alive
reuse, the answer whole or streamed, and the failures the proxy tells apart (not sent, broken
after sending); against a scripted raw server in the test's own event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from podium.gateway import http1
from podium.gateway.upstream import NOT_SENT, SENT_FAILED, Upstream

Script = Callable[[bytes, asyncio.Transport], None]


def answer(body: bytes, *, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-Mixed-Case: yes\r\n"
            + extra + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class Raw:
    """A raw TCP server: every request's bytes (as read), every connection, and `script`
    deciding what each read is answered with."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.reads: list[bytes] = []
        self.connections = 0
        self.closed = 0
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> Raw:
        outer = self

        class Proto(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                self.transport = transport
                outer.connections += 1

            def data_received(self, data: bytes) -> None:
                outer.reads.append(data)
                outer.script(data, self.transport)

            def connection_lost(self, exc: Exception | None) -> None:
                outer.closed += 1

        self._server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()


@pytest.fixture
async def echoing() -> AsyncIterator[Raw]:
    server = await Raw(lambda data, t: t.write(answer(b'{"ok": true}'))).start()
    yield server
    await server.stop()


async def post(upstream: Upstream, url: str) -> bytes:
    """One `{}` POST read to its end and released (its connection back to the pool)."""
    response = await upstream.send("POST", url, [], b"{}")
    body = await response.read()
    response.release()
    return body


async def eventually(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_a_post_is_one_write_and_its_answer_is_read_whole(echoing: Raw) -> None:
    upstream = Upstream(connect_timeout_s=2)
    url = f"http://127.0.0.1:{echoing.port}/v2/models/m/infer?x=1"
    response = await upstream.send("POST", url, [("content-type", "application/json"),
                                                 ("x-client", "kept")], b'{"inputs": []}')
    assert isinstance(response, http1.Response)
    assert response.status == 200 and response.content_length == 12
    assert response.headers["x-mixed-case"] == "yes"  # looked up by lowercase name
    assert (b"X-Mixed-Case", b"yes") in response.raw_headers  # relayed as it came
    assert await response.read() == b'{"ok": true}'
    response.release()
    assert echoing.reads == [
        f"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{echoing.port}\r\n"
        "content-type: application/json\r\nx-client: kept\r\nContent-Length: 14\r\n\r\n"
        '{"inputs": []}'.encode()]
    await upstream.aclose()


async def test_a_connection_read_to_its_end_is_reused_and_one_released_early_is_not(
        ) -> None:
    whole = answer(b'{"ok": true}')
    reads: list[bytes] = []

    def script(data: bytes, transport: asyncio.Transport) -> None:
        reads.append(data)
        # the fourth answer's body is still coming when the gateway lets go of it
        transport.write(whole[:-4] if len(reads) == 4 else whole)

    server = await Raw(script).start()
    upstream = Upstream(connect_timeout_s=2)
    url = f"http://127.0.0.1:{server.port}/infer"
    for _ in range(3):
        await post(upstream, url)
    assert server.connections == 1
    response = await upstream.send("POST", url, [], b"{}")
    response.release()  # before its body was read to its end: not reusable
    await eventually(lambda: server.closed == 1)
    assert await post(upstream, url) == b'{"ok": true}'
    assert server.connections == 2
    await upstream.aclose()
    await server.stop()


async def test_an_idle_connection_past_its_time_is_closed_not_reused(
        echoing: Raw, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = Upstream(connect_timeout_s=2)
    url = f"http://127.0.0.1:{echoing.port}/infer"
    await post(upstream, url)
    monkeypatch.setattr(http1, "IDLE_CLOSE_S", -1.0)  # every idle connection is too old
    await post(upstream, url)
    assert echoing.connections == 2
    await eventually(lambda: echoing.closed == 1)
    await upstream.aclose()


async def test_a_streamed_answer_comes_chunk_by_chunk() -> None:
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    transports: list[asyncio.Transport] = []

    def script(data: bytes, transport: asyncio.Transport) -> None:
        transports.append(transport)
        transport.write(head + b"7\r\ndata: 1\r\n")

    server = await Raw(script).start()
    upstream = Upstream(connect_timeout_s=2)
    response = await upstream.send("POST", f"http://127.0.0.1:{server.port}/v1/x", [], b"{}")
    assert response.content_length is None
    chunks = response.content.iter_any()
    assert await chunks.__anext__() == b"data: 1"  # before the answer ended
    transports[0].write(b"7\r\ndata: 2\r\n0\r\n\r\n")
    assert [chunk async for chunk in chunks] == [b"data: 2"]
    response.release()
    assert server.closed == 0  # ended: kept for the next request
    await upstream.aclose()
    await server.stop()


async def test_no_connection_is_not_sent_and_a_broken_one_is_sent_failed() -> None:
    upstream = Upstream(connect_timeout_s=2)
    closed = await Raw(lambda data, t: None).start()
    port = closed.port
    await closed.stop()
    await asyncio.sleep(0)
    with pytest.raises(NOT_SENT):
        await upstream.send("POST", f"http://127.0.0.1:{port}/infer", [], b"{}")

    server = await Raw(lambda data, t: t.close()).start()  # reads the request, then hangs up
    with pytest.raises(SENT_FAILED, match="closed the connection"):
        await upstream.send("POST", f"http://127.0.0.1:{server.port}/infer", [], b"{}")

    half = await Raw(lambda data, t: (t.write(answer(b"0123456789")[:-4]), t.close())).start()
    response = await upstream.send("POST", f"http://127.0.0.1:{half.port}/infer", [], b"{}")
    with pytest.raises(SENT_FAILED):  # the body broke off
        await response.read()
    response.release()

    garbled = await Raw(lambda data, t: t.write(b"NOT HTTP AT ALL\r\n\r\n")).start()
    with pytest.raises(SENT_FAILED, match="not valid HTTP"):
        await upstream.send("POST", f"http://127.0.0.1:{garbled.port}/infer", [], b"{}")
    for raw in (server, half, garbled):
        await raw.stop()
    await upstream.aclose()


async def test_a_cancelled_request_closes_its_connection() -> None:
    server = await Raw(lambda data, t: None).start()  # never answers
    upstream = Upstream(connect_timeout_s=2)
    task = asyncio.ensure_future(
        upstream.send("POST", f"http://127.0.0.1:{server.port}/infer", [], b"{}"))
    await eventually(lambda: bool(server.reads))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: server.closed == 1)  # the instance sees the client leave
    await server.stop()
    await upstream.aclose()


async def test_the_credential_replaces_the_clients_key(echoing: Raw) -> None:
    upstream = Upstream(connect_timeout_s=2, credential="internal")
    response = await upstream.send("POST", f"http://127.0.0.1:{echoing.port}/infer",
                                   [("authorization", "Bearer client-key")], b"{}")
    await response.read()
    response.release()
    assert b"Authorization: Bearer internal\r\n" in echoing.reads[0]
    assert b"client-key" not in echoing.reads[0]
    await upstream.aclose()


@pytest.mark.parametrize(("method", "url", "headers", "taken"), [
    ("POST", "http://127.0.0.1:1/infer", [], True),
    ("GET", "http://127.0.0.1:1/v2/models/m", [], False),
    ("HEAD", "http://127.0.0.1:1/x", [], False),
    ("POST", "https://instance:1/infer", [], False),
    ("POST", "http://127.0.0.1:1/infer", [("Expect", "100-continue")], False),
])
def test_what_the_own_client_takes(method: str, url: str, headers: list[tuple[str, str]],
                                   taken: bool) -> None:
    assert http1.takes(method, url, headers) is taken


async def test_a_slow_reader_pauses_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "HIGH_WATER", 64)
    transports: list[asyncio.Transport] = []

    def script(data: bytes, transport: asyncio.Transport) -> None:
        transports.append(transport)
        transport.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                        + b"".join(b"40\r\n" + bytes([65 + i]) * 64 + b"\r\n" for i in range(4))
                        + b"0\r\n\r\n")

    server = await Raw(script).start()
    upstream = Upstream(connect_timeout_s=2)
    response = await upstream.send("POST", f"http://127.0.0.1:{server.port}/x", [], b"{}")
    assert isinstance(response, http1.Response)
    await eventually(lambda: response.content.done)
    conn = response._conn
    assert conn._paused  # more than HIGH_WATER unread
    chunks = [chunk async for chunk in response.content.iter_any()]
    assert b"".join(chunks) == b"".join(bytes([65 + i]) * 64 for i in range(4))
    assert not conn._paused  # read: resumed
    response.release()
    await upstream.aclose()
    await server.stop()


async def test_a_connection_the_instance_closed_is_not_reused() -> None:
    whole = answer(b"{}")
    server = await Raw(lambda data, t: (t.write(whole), t.close())).start()
    upstream = Upstream(connect_timeout_s=2)
    url = f"http://127.0.0.1:{server.port}/infer"
    response = await upstream.send("POST", url, [], b"{}")
    assert isinstance(response, http1.Response)
    assert await response.read() == b"{}"
    conn = response._conn
    response.release()  # kept: the answer said nothing of closing
    await eventually(lambda: conn.closed)  # then the instance hung up, and the gateway saw it
    assert await post(upstream, url) == b"{}"  # on a new connection
    assert server.connections == 2
    await upstream.aclose()
    await server.stop()


async def test_idle_connections_of_an_address_no_longer_asked_for_are_closed_and_forgotten(
        echoing: Raw) -> None:
    other = await Raw(lambda data, t: t.write(answer(b"{}"))).start()
    upstream = Upstream(connect_timeout_s=2)
    pool = upstream._pool
    gone = f"http://127.0.0.1:{other.port}/infer"  # an instance that then leaves routing
    await post(upstream, gone)
    assert ("127.0.0.1", other.port) in pool._idle
    for conn in pool._idle[("127.0.0.1", other.port)]:
        conn.idle_since -= http1.IDLE_CLOSE_S + 1  # idle past its time: nobody asked again
    pool._swept -= http1.IDLE_CLOSE_S + 1  # and the last sweep as long ago
    url = f"http://127.0.0.1:{echoing.port}/infer"
    await post(upstream, url)  # traffic to another instance
    assert ("127.0.0.1", other.port) not in pool._idle  # forgotten
    await eventually(lambda: other.closed == 1)  # and its socket closed
    assert [len(c) for c in pool._idle.values()] == [1]  # the live instance's stays pooled
    await post(upstream, url)
    assert echoing.connections == 1  # and is reused
    await upstream.aclose()
    await other.stop()
