"""The gateway's HTTP protocol writes an answer's head with its body: a whole answer in one
write, a streamed answer's head in the turn it was given (not held until its first chunk)."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from podium.gateway.asgi import lifespan
from podium.gateway.http_server import _HeadHeld, bounded_head_protocol
from tests.support.servers import Served


async def _nothing() -> None:
    pass


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_a_whole_answer_is_one_write_and_a_lone_head_leaves_at_the_turns_end() -> None:
    loop = asyncio.get_running_loop()
    transport = FakeTransport()
    held = _HeadHeld(transport, loop)  # type: ignore[arg-type]
    held.write(b"HEAD;")
    held.write(b"body")
    assert transport.writes == [b"HEAD;body"]
    await asyncio.sleep(0)  # the turn's end: nothing more to write
    held.write(b"more")
    assert transport.writes == [b"HEAD;body", b"more"]

    streamed = FakeTransport()
    held = _HeadHeld(streamed, loop)  # type: ignore[arg-type]
    held.write(b"HEAD;")
    assert streamed.writes == []
    await asyncio.sleep(0)
    assert streamed.writes == [b"HEAD;"]  # left with the turn, before any chunk
    held.write(b"chunk")
    assert streamed.writes == [b"HEAD;", b"chunk"]
    assert held.get_extra_info("peername") == "info:peername"  # the rest is the transport's


async def test_closing_writes_the_held_head_first() -> None:
    transport = FakeTransport()
    held = _HeadHeld(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"HEAD;")
    held.close()
    assert transport.writes == [b"HEAD;"] and transport.closed
    await asyncio.sleep(0)
    assert transport.writes == [b"HEAD;"]  # not written twice


def test_a_streamed_head_reaches_the_client_before_its_body_over_the_protocol() -> None:
    body_may_come = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, on_shutdown=_nothing)
            return
        whole = scope["path"] == "/whole"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"5")] if whole else []})
        if not whole:  # the body only once the client has read the head
            await asyncio.get_running_loop().run_in_executor(None, body_may_come.wait, 10)
        await send({"type": "http.response.body", "body": b"hello"})

    served = Served(app, http=bounded_head_protocol(1 << 16))
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
            body_may_come.set()
            rest = head.split(b"\r\n\r\n", 1)[1]
            while not rest.endswith(b"0\r\n\r\n"):
                rest += sock.recv(4096)
            assert rest == b"5\r\nhello\r\n0\r\n\r\n"

            sock.sendall(b"GET /whole HTTP/1.1\r\nhost: x\r\n\r\n")  # same connection
            answer = b""
            while not answer.endswith(b"hello"):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200") and b"content-length: 5" in answer
    finally:
        body_may_come.set()
        served.stop()
