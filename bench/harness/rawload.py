"""A light HTTP/1.1 load generator for the overload benches: one pre-encoded request sent over
keep-alive connections by several processes, so the load a bench offers is not capped by its
own client. One of the harness's load generators (`loops` is the other, asyncio + httpx).

httpx costs about a millisecond of CPU per request in the client; on a 2-core machine that
shares its cores with the servers under test, that alone held `overload_xgb.py`'s "4x" spike to
~150 req/s. Here a request is one `write` of bytes built once and a parse of the status line and
`Content-Length`, in `--client-processes` processes with their own event loops. Arrivals are
scheduled on absolute times (a Poisson process per client process, at its share of the rate): a
client that falls behind sends the late ones at once instead of silently lowering the rate, and
`lag` in its report says by how much it fell behind.

Each process keeps at most `max_connections` connections open (a request finding none idle
and the cap reached waits for one, and that wait is part of its time): without a cap a server
that falls behind makes the client open a connection per waiting request, thousands a second,
and the closed ones' TIME_WAITs exhausted the machine's ephemeral ports (other processes'
`bind` and `connect` failed). The idle ones are reset at the end of a loop (no TIME_WAIT).
A `stamp`ed target carries its send time (`x-bench-sent`, CLOCK_MONOTONIC nanoseconds, which
every process of the machine shares) so a server can say how long the request waited before
its head was parsed (`bench.harness.servertimes`). The processes run uvloop when installed.

A closed loop's client that is refused (429) waits `REFUSED_WAIT_S` (the `Retry-After` Podium
sends) before it sends again, as a client that honours it does; sent again at once, a client
past the server's in-flight bound would spin on refusals and make the closed loop an overload.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import random
import re
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from bench.harness.loops import check_loopback

REFUSED_WAIT_S = 1.0
"""How long a closed loop's refused client waits before it sends again (Podium's Retry-After)."""

TIMEOUT_S = 120.0
MAX_CONNECTIONS = 256
"""Connections one process keeps open at most (see the module's docstring)."""
SENT_HEADER = b"x-bench-sent"


@dataclass(frozen=True)
class Target:
    """Where the requests go and the bytes of one request."""

    host: str
    port: int
    raw: bytes
    first_chunk: bool = False
    """Time a chunked (streamed) answer to its first chunk, not to its end (an LLM's time to
    the first token), and count an error event in it (`{"error": ... "code": N}`) as status
    N, as a streaming client would."""
    stamp: bool = False
    """Send each request's send time as `x-bench-sent` (monotonic ns); the answer tuples then
    end with it."""
    max_connections: int = MAX_CONNECTIONS
    """Connections one `connections()` keeps open at most."""

    @classmethod
    def post_json(cls, url: str, body: bytes, *, first_chunk: bool = False,
                  stamp: bool = False, max_connections: int = MAX_CONNECTIONS) -> Target:
        parts = urlsplit(check_loopback(url))
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        head = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        return cls(host, port, head.encode() + body, first_chunk, stamp, max_connections)

    def connections(self) -> _Connections:
        """What one client (a closed loop's) or one process (an open loop's) sends with."""
        return _Connections(self)


class Sender(Protocol):
    """A target of the loops: `connections().send()` sends one request and returns (status,
    seconds, *anything the caller wants back for it); `Target` and `grpcload.GrpcTarget`."""

    def connections(self) -> Any: ...


class _Connections:
    """Keep-alive connections to one target, at most `target.max_connections` open: an idle
    one is reused, else a new one opened, else the request waits for one to be freed."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.num_open = 0
        self.num_opened = 0
        """Connections opened in all."""
        self.num_waits = 0
        """Requests that waited for a connection (the cap reached)."""
        self._waiting: deque[asyncio.Future[Any]] = deque()
        end = target.raw.index(b"\r\n\r\n") + 2
        self._head, self._rest = target.raw[:end], target.raw[end:]

    async def send(self) -> tuple[int, float] | tuple[int, float, int]:
        """One request: (status, seconds to the whole answer[, its stamp]); 599 for a failed
        connection. An idle connection the server closed meanwhile (its keep-alive timeout)
        is never reused, and a reused one that closes before answering is retried once on a
        new connection, as HTTP clients do; a new connection that fails is the server's."""
        sent = time.monotonic()
        raw, stamp = self.target.raw, None
        if self.target.stamp:
            stamp = int(sent * 1e9)
            raw = b"%s%s: %d\r\n%s" % (self._head, SENT_HEADER, stamp, self._rest)
        while self.idle and (self.idle[-1][0].at_eof() or self.idle[-1][1].is_closing()):
            self._drop(self.idle.pop())
        conn = self.idle.pop() if self.idle else None
        if conn is None and self.num_open >= self.target.max_connections:
            self.num_waits += 1
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            conn = await waiter  # a freed connection, or None: room for a new one
        if conn is not None:
            status = await self._on(conn, sent, raw)
            if status is not None:
                return status if stamp is None else (*status, stamp)
        status = await self._on(None, sent, raw) or (599, time.monotonic() - sent)
        return status if stamp is None else (*status, stamp)

    def close(self) -> None:
        """Reset the idle connections (an abortive close leaves no TIME_WAIT behind)."""
        while self.idle:
            writer = self.idle.pop()[1]
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()

    def _release(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        """An answered request's connection: to a waiting request, else idle."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    def _drop(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        """A connection closed (or one that failed to open): its room to a waiting request."""
        if conn is not None:
            conn[1].close()
        self.num_open -= 1
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _on(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
                  sent: float, raw: bytes) -> tuple[int, float] | None:
        """The request on `conn` (None: a new connection); None when a reused one turned out
        closed before any answer (the caller retries)."""
        reused = conn is not None
        if conn is None:
            self.num_open += 1
            self.num_opened += 1
        try:
            if conn is None:
                conn = await asyncio.open_connection(self.target.host, self.target.port)
            reader, writer = conn
            writer.write(raw)
            status_line = await asyncio.wait_for(reader.readline(), TIMEOUT_S)
            if not status_line:
                self._drop(conn)
                return None if reused else (599, time.monotonic() - sent)
            status = int(status_line.split(b" ", 2)[1])
            length, close, chunked = 0, False, False
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True  # Ray Serve's proxy answers so
            took = None
            if chunked:
                first, error = await _skip_chunks(reader)
                if self.target.first_chunk:
                    took = first - sent
                    status = error or status
            else:
                await reader.readexactly(length)
            if close:
                self._drop(conn)
            else:
                self._release(conn)
            return status, took if took is not None else time.monotonic() - sent
        except ConnectionResetError:
            self._drop(conn)
            return None if reused else (599, time.monotonic() - sent)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            self._drop(conn)
            return 599, time.monotonic() - sent


_ERROR_CODE = re.compile(rb'"code"\s*:\s*(\d{3})')


async def _skip_chunks(reader: asyncio.StreamReader) -> tuple[float, int | None]:
    """Read a chunked body to its end (the last chunk, then the trailers' blank line); when
    its first chunk came, and the code of an error event in it (None: none)."""
    first, error = None, None
    while size := int((await reader.readline()).split(b";", 1)[0], 16):
        data = await reader.readexactly(size + 2)
        first = first or time.monotonic()
        if error is None and b'{"error"' in data:
            match = _ERROR_CODE.search(data)
            error = int(match[1]) if match else 500
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass
    return first or time.monotonic(), error


async def _open(target: Sender, phases: list[tuple[float, float]], start: float,
                seed: int) -> tuple[list[tuple[float, int, float]], float, dict[str, int]]:
    """Poisson arrivals at each phase's rate from `start` (a monotonic time); the answers
    (sent, status, seconds, *what the sender adds), the largest lag behind the schedule and
    the connections' counts."""
    rng, conns = random.Random(seed), target.connections()
    answers: list[tuple[float, int, float]] = []
    tasks: list[asyncio.Task[None]] = []
    lag = 0.0

    async def one(at: float) -> None:
        answers.append((at, *await conns.send()))

    await asyncio.sleep(max(0.0, start - time.monotonic()))
    due, phase_start = start, start
    for rate, seconds in phases:
        end = phase_start + seconds
        while (due := due + rng.expovariate(rate)) < end:
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            else:
                lag = max(lag, now - due)
            tasks.append(asyncio.create_task(one(time.monotonic())))
        phase_start, due = end, end
    await asyncio.gather(*tasks)
    return answers, lag, _finish(conns)


async def _closed(target: Sender, concurrency: int, seconds: float, start: float
                  ) -> tuple[list[tuple[float, int, float]], float, dict[str, int]]:
    answers: list[tuple[float, int, float]] = []
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    deadline = start + seconds
    counts: dict[str, int] = {}

    async def worker() -> None:
        conns = target.connections()  # one connection per client, as a closed loop has
        while (now := time.monotonic()) < deadline:
            answer = await conns.send()
            answers.append((now, *answer))
            if answer[0] == 429:  # as its Retry-After says, not at once
                await asyncio.sleep(max(0.0, min(REFUSED_WAIT_S, deadline - time.monotonic())))
        for key, value in _finish(conns).items():
            counts[key] = counts.get(key, 0) + value

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers, 0.0, counts


def _finish(conns: Any) -> dict[str, int]:
    """Close what `conns` holds idle; how many connections it opened and how many requests
    waited for one (a sender that counts them: `Target`'s)."""
    if isinstance(conns, _Connections):
        conns.close()
        return {"connections": conns.num_opened, "connection_waits": conns.num_waits}
    return {}


def _child(kind: str, args: tuple, out: multiprocessing.connection.Connection,
           nice: int = 0) -> None:
    if nice:  # a generator above the servers' priority: its own wake-ups are not measured
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    # no collections while it sends: the answers it keeps grow to ~10^5 tuples, and a full
    # collection of them would stall every request in flight (the loop makes no cycles to free)
    gc.disable()
    loop = _open if kind == "open" else _closed
    out.send(_event_loop_run(loop(*args), uvloop_ok=isinstance(args[0], Target)))
    out.close()


def _event_loop_run(coro: Any, *, uvloop_ok: bool) -> Any:
    """`asyncio.run(coro)`, on uvloop when installed and `uvloop_ok` (half the CPU per
    request of asyncio's own loop; grpc.aio's senders keep asyncio's)."""
    if uvloop_ok:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def _run(kind: str, per_process: list[tuple], nice: int = 0, counts: dict[str, int] | None = None
         ) -> tuple[list[tuple[float, int, float]], float]:
    ctx = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for args in per_process:
        mine, theirs = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(kind, args, theirs, nice), daemon=True)
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    answers: list[tuple[float, int, float]] = []
    lag = 0.0
    for pipe in pipes:
        got, their_lag, their_counts = pipe.recv()
        answers += got
        lag = max(lag, their_lag)
        if counts is not None:
            for key, value in their_counts.items():
                counts[key] = counts.get(key, 0) + value
    for proc in procs:
        proc.join()
    return sorted(answers), lag


def open_loop(target: Sender, phases: list[tuple[float, float]], *, processes: int = 2,
              seed: int = 0, nice: int = 0, counts: dict[str, int] | None = None
              ) -> tuple[list[tuple[float, int, float]], float]:
    """Poisson arrivals, `phases` of (rate per second, seconds), split over `processes` (at
    `nice`: negative needs root); `counts` gets the connections' counts added."""
    start = time.monotonic() + 0.5  # every process is up before the first arrival
    share = [(rate / processes, seconds) for rate, seconds in phases]
    return _run("open", [(target, share, start, seed + i) for i in range(processes)], nice,
                counts)


def closed_loop(target: Sender, concurrency: int, seconds: float, *, processes: int = 2,
                nice: int = 0, counts: dict[str, int] | None = None
                ) -> list[tuple[float, int, float]]:
    """`concurrency` clients back to back for `seconds`, split over `processes`."""
    start = time.monotonic() + 0.5
    counts_per = [concurrency // processes + (i < concurrency % processes)
                  for i in range(processes)]
    return _run("closed", [(target, n, seconds, start) for n in counts_per if n], nice,
                counts)[0]
