"""The gateway's own HTTP/1.1 client for forwarded POSTs: one write per request, no task of
its own, pooled keep-alive connections.

A forwarded inference is the gateway's hot path: at several times a classic model's capacity
the gateway, the instance and the refusals share one core, and every microsecond the gateway
spends on an admitted request is taken from the instance and delays the next one
(`bench/overload_xgb.py`). Through aiohttp a small forwarded POST cost ~87 µs of the gateway's
CPU, and on Python 3.11 aiohttp writes a request's body from a task of its own (eager only
from 3.12), so the request left one turn of a busy event loop after it was routed. Here a
request is one `transport.write` of its head and body, made in the routing task itself, and
the answer is parsed by httptools (llhttp, the parser uvicorn serves with) straight into a
`Response` that offers the part of aiohttp's `ClientResponse` the proxy reads (`status`,
`headers`, `raw_headers`, `content_length`, `read`, `content.iter_any`, `release`, `close`).

The rules are aiohttp's as the gateway used it: no redirects, cookies or decompression; no
read timeout (an LLM answer may take minutes), a connect timeout; a connection that failed
before the request left is `ConnectFailed` (never sent: safe to send elsewhere), one that broke
after it left is `ConnectionBroken` (the instance may have acted). An idle pooled connection
is closed after `IDLE_CLOSE_S`, before the instances' own keep-alive closes it, so a request is
not sent on a connection the instance is closing. A request whose task is cancelled (its
client left) closes its connection, so the instance sees the disconnect and cancels the work;
an answer released before it was read to its end closes it too. A streamed answer the client
reads slower than the instance writes stops the connection's reads past `HIGH_WATER` bytes.

Only what this client can do is sent through it (`takes`): a POST over plain HTTP without
`Expect`; anything else (GET, HEAD, TLS upstreams) stays with aiohttp (`gateway.upstream`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import httptools

IDLE_CLOSE_S = 15.0
"""Longest a pooled connection stays idle (below the instances' 75 s keep-alive)."""
HIGH_WATER = 1 << 20
"""Bytes of an answer held unread before the connection stops reading (resumed below half)."""


class ConnectFailed(OSError):
    """No connection to the instance (refused, unreachable, timed out): nothing was sent."""


class ConnectionBroken(ConnectionError):
    """The connection failed after the request was written: the instance may have acted."""


def takes(method: str, url: str, headers: list[tuple[str, str]]) -> bool:
    """Whether this client sends the request (else aiohttp does)."""
    return (method == "POST" and url.startswith("http://")
            and not any(k.lower() == "expect" for k, _ in headers))


class _Body:
    """The unread part of an answer's body: `iter_any` as aiohttp's `StreamReader`."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    def feed(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        if self.size > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def end(self, error: BaseException | None = None) -> None:
        if not self.done:
            self.done, self.error = True, error
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def _wait(self) -> None:
        self.waiter = self._conn.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    async def iter_any(self):  # type: ignore[no-untyped-def]  # AsyncIterator[bytes]
        """Each piece of the body as it arrives."""
        while True:
            if self.chunks:
                chunk = self.chunks.popleft()
                self.size -= len(chunk)
                if self.size < HIGH_WATER // 2:
                    self._conn.resume()
                yield chunk
            elif self.done:
                if self.error is not None:
                    raise self.error
                return
            else:
                await self._wait()


class Response:
    """An instance's answer: its head at once, its body to read or stream."""

    def __init__(self, conn: _Conn, status: int,
                 raw_headers: tuple[tuple[bytes, bytes], ...]) -> None:
        self._conn = conn
        self.status = status
        self.raw_headers = raw_headers
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                        for k, v in raw_headers}
        """By lowercase name (the last of repeated ones): the names the proxy looks up."""
        length = self.headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.content = _Body(conn)

    async def read(self) -> bytes:
        """The whole body."""
        body = self.content
        while not body.done:
            await body._wait()
        if body.error is not None:
            raise body.error
        whole = b"".join(body.chunks)
        body.chunks.clear()
        body.size = 0
        return whole

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool when the answer was
        read to its end and may be kept, else it is closed."""
        self._conn.finished(self)

    def close(self) -> None:
        """Close the connection (an answer not to be read)."""
        self._conn.close()


class _Conn(asyncio.Protocol):
    """One keep-alive connection to an instance; one request at a time."""

    def __init__(self, pool: Pool, key: tuple[str, int]) -> None:
        self.pool, self.key = pool, key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[Response] | None = None
        self.response: Response | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self.reusable = False
        """The last answer ended and the instance keeps the connection open."""
        self.closed = False
        self.idle_since = 0.0
        self._paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(ConnectionBroken(f"the instance's answer is not valid HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._broken(ConnectionBroken("the instance closed the connection"
                                      + (f": {exc}" if exc else "")))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.response = Response(self, self.parser.get_status_code(), tuple(self._headers))
        self._headers = []
        if self.head is not None and not self.head.done():
            self.head.set_result(self.response)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.content.feed(body)

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        if self.response is not None:
            self.response.content.end()

    # the client's side
    def send(self, raw: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None
        self.head = self.loop.create_future()
        self.response, self.reusable = None, False
        self.transport.write(raw)
        return self.head

    def finished(self, response: Response) -> None:
        if self.response is not response:
            return
        self.response = None
        if self.reusable and response.content.done and not self.closed:
            self.head = None
            self.pool.put(self)
        else:
            self.close()

    @property
    def gone(self) -> bool:
        """Closed, by this end or (as the transport says) by the instance."""
        return self.closed or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            assert self.transport is not None
            self.transport.close()

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def _broken(self, error: ConnectionBroken) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        elif self.response is not None:
            self.response.content.end(error)
        self.close()


class Pool:
    """Keep-alive connections by (host, port); a request takes the most recently idle one."""

    def __init__(self, connect_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._swept = time.monotonic()

    async def send(self, host: str, port: int, raw: bytes) -> Response:
        """Write `raw` (a whole request) on a connection to (host, port); its answer's head.
        `ConnectFailed` when no connection opened, `ConnectionBroken` when one broke after
        the write; cancelled, the connection is closed."""
        conn = self._take((host, port)) or await self._connect(host, port)
        try:
            return await conn.send(raw)
        except BaseException:
            conn.close()
            raise

    def put(self, conn: _Conn) -> None:
        now = time.monotonic()
        if now - self._swept > IDLE_CLOSE_S:
            self._sweep(now)
        conn.idle_since = now
        self._idle.setdefault(conn.key, []).append(conn)

    def _sweep(self, now: float) -> None:
        """Close and forget, at every address, the idle connections past their time or closed
        by their instance: `_take` looks only at the address asked for, and an instance that
        left the route table is never asked for again (its connections, sockets included, would
        stay for the gateway's life). At most once per `IDLE_CLOSE_S`, from `put`."""
        self._swept = now
        for key, conns in list(self._idle.items()):
            kept = []
            for conn in conns:
                if conn.gone or now - conn.idle_since > IDLE_CLOSE_S:
                    conn.close()
                else:
                    kept.append(conn)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]

    def close(self) -> None:
        """Close every idle connection."""
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            if conn.gone:
                continue  # closed by the instance (its end of the connection is gone)
            if now - conn.idle_since > IDLE_CLOSE_S:  # the older ones are idle longer still
                conn.close()
                for old in conns:
                    old.close()
                conns.clear()
                return None
            return conn
        return None

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, (host, port)), host, port),
                self.connect_timeout_s)
        except TimeoutError:
            raise ConnectFailed(f"connecting to {host}:{port} timed out after "
                                f"{self.connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from exc
        return conn


def request_bytes(method: str, target: str, host: str, headers: list[tuple[str, str]],
                  body: bytes) -> bytes:
    """The request as it goes on the wire: the client's headers (hop-by-hop ones already
    dropped by the proxy), `Host` and the body's length."""
    head = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    head += [f"{name}: {value}\r\n" for name, value in headers]
    head.append(f"Content-Length: {len(body)}\r\n\r\n")
    return "".join(head).encode("latin-1") + body
