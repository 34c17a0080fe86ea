"""Small real servers on loopback for gateway tests: uvicorn in a thread, raw sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.ports import free_port


class Served:
    """An ASGI app served by uvicorn on 127.0.0.1 (a free port) in a daemon thread."""

    def __init__(self, app: Any, **options: Any) -> None:
        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                lifespan="on", access_log=False, **options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def upstream(version: str) -> Starlette:
    """An instance stand-in: echoes what it got and which version answered."""
    seen: list[dict[str, Any]] = []
    streams = {"open": 0, "closed_early": 0}

    async def echo(request: Request) -> Response:
        body = await request.body()
        record = {"version": version, "path": request.url.path, "query": request.url.query,
                  "body": json.loads(body) if body else None,
                  "auth": request.headers.get("authorization"),
                  "headers": sorted(request.headers.keys())}
        seen.append(record)
        path = request.url.path
        if path.endswith("/fail"):
            return JSONResponse({"error": "boom"}, status_code=500)
        if path.endswith("/slow"):
            await asyncio.sleep(float(request.query_params.get("s", "0.5")))
        if path.endswith("/sse"):
            events = int(request.query_params.get("n", "3"))
            return StreamingResponse(_events(version, events, streams),
                                     media_type="text/event-stream")
        if path.endswith("/chunked"):  # no Content-Length: relayed as it comes
            size = int(request.query_params.get("size", "10"))
            return StreamingResponse(_chunks(size), media_type="application/octet-stream")
        return JSONResponse(record, headers={"x-answered-by": version,
                                             "keep-alive": "timeout=75"})

    async def ready(_request: Request) -> Response:
        return JSONResponse({"ready": True})

    app = Starlette(routes=[Route("/health/ready", ready),
                            Route("/{path:path}", echo, methods=["GET", "POST"])])
    app.state.seen = seen
    app.state.streams = streams
    return app


async def _events(version: str, num_events: int, streams: dict[str, int]) -> AsyncIterator[str]:
    streams["open"] += 1
    done = False
    try:
        for i in range(num_events):
            yield f"data: {json.dumps({'i': i, 'version': version, 't': time.monotonic()})}\n\n"
            await asyncio.sleep(0.3)
        yield "data: [DONE]\n\n"
        done = True
    finally:
        streams["open"] -= 1
        streams["closed_early"] += 0 if done else 1


async def _chunks(size: int) -> AsyncIterator[bytes]:
    for start in range(0, size, 65536):
        yield bytes(i % 251 for i in range(start, min(size, start + 65536)))


class RawServer:
    """A loopback socket server that reads each request and answers it with `answer`."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.num_requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        """Reply (or not) on a connection whose request was read; it is closed after."""

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if conn.recv(65536):
                self.num_requests += 1
            self.answer(conn)
            conn.close()

    def stop(self) -> None:
        self.sock.close()


class Dropper(RawServer):
    """Accepts a connection, reads the request, then closes without answering."""


class Truncator(RawServer):
    """Answers 200 with a Content-Length it does not keep: half the body, then it closes."""

    def answer(self, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"half\": ")


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting fails before anything is sent."""
    return f"http://127.0.0.1:{free_port()}"
