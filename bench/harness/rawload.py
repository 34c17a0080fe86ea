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
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from bench.harness.loops import check_loopback

TIMEOUT_S = 120.0


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

    @classmethod
    def post_json(cls, url: str, body: bytes, *, first_chunk: bool = False) -> Target:
        parts = urlsplit(check_loopback(url))
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        head = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        return cls(host, port, head.encode() + body, first_chunk)

    def connections(self) -> _Connections:
        """What one client (a closed loop's) or one process (an open loop's) sends with."""
        return _Connections(self)


class Sender(Protocol):
    """A target of the loops: `connections().send()` sends one request and returns (status,
    seconds, *anything the caller wants back for it); `Target` and `grpcload.GrpcTarget`."""

    def connections(self) -> Any: ...


class _Connections:
    """Idle keep-alive connections to one target (a new one when none is idle)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def send(self) -> tuple[int, float]:
        """One request: (status, seconds to the whole answer); 599 for a failed connection.
        An idle connection the server closed meanwhile (its keep-alive timeout) is never
        reused, and a reused one that closes before answering is retried once on a new
        connection, as HTTP clients do; a new connection that fails is the server's."""
        sent = time.monotonic()
        while self.idle and (self.idle[-1][0].at_eof() or self.idle[-1][1].is_closing()):
            self.idle.pop()[1].close()
        if self.idle:
            status = await self._on(self.idle.pop(), sent)
            if status is not None:
                return status
        return await self._on(None, sent) or (599, time.monotonic() - sent)

    async def _on(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
                  sent: float) -> tuple[int, float] | None:
        """The request on `conn` (None: a new connection); None when a reused one turned out
        closed before any answer (the caller retries)."""
        reused = conn is not None
        try:
            if conn is None:
                conn = await asyncio.open_connection(self.target.host, self.target.port)
            reader, writer = conn
            writer.write(self.target.raw)
            status_line = await asyncio.wait_for(reader.readline(), TIMEOUT_S)
            if not status_line:
                writer.close()
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
                writer.close()
            else:
                self.idle.append(conn)
            return status, took if took is not None else time.monotonic() - sent
        except ConnectionResetError:
            if conn is not None:
                conn[1].close()
            return None if reused else (599, time.monotonic() - sent)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            if conn is not None:
                conn[1].close()
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
                seed: int) -> tuple[list[tuple[float, int, float]], float]:
    """Poisson arrivals at each phase's rate from `start` (a monotonic time); the answers
    (sent, status, seconds, *what the sender adds) and the largest lag behind the schedule."""
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
    return answers, lag


async def _closed(target: Sender, concurrency: int, seconds: float, start: float
                  ) -> tuple[list[tuple[float, int, float]], float]:
    answers: list[tuple[float, int, float]] = []
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    deadline = start + seconds

    async def worker() -> None:
        conns = target.connections()  # one connection per client, as a closed loop has
        while (now := time.monotonic()) < deadline:
            answers.append((now, *await conns.send()))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers, 0.0


def _child(kind: str, args: tuple, out: multiprocessing.connection.Connection,
           nice: int = 0) -> None:
    if nice:  # a generator above the servers' priority: its own wake-ups are not measured
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    loop = _open if kind == "open" else _closed
    out.send(asyncio.run(loop(*args)))
    out.close()


def _run(kind: str, per_process: list[tuple], nice: int = 0
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
        got, their_lag = pipe.recv()
        answers += got
        lag = max(lag, their_lag)
    for proc in procs:
        proc.join()
    return sorted(answers), lag


def open_loop(target: Sender, phases: list[tuple[float, float]], *, processes: int = 2,
              seed: int = 0, nice: int = 0) -> tuple[list[tuple[float, int, float]], float]:
    """Poisson arrivals, `phases` of (rate per second, seconds), split over `processes` (at
    `nice`: negative needs root)."""
    start = time.monotonic() + 0.5  # every process is up before the first arrival
    share = [(rate / processes, seconds) for rate, seconds in phases]
    return _run("open", [(target, share, start, seed + i) for i in range(processes)], nice)


def closed_loop(target: Sender, concurrency: int, seconds: float, *, processes: int = 2,
                nice: int = 0) -> list[tuple[float, int, float]]:
    """`concurrency` clients back to back for `seconds`, split over `processes`."""
    start = time.monotonic() + 0.5
    counts = [concurrency // processes + (i < concurrency % processes)
              for i in range(processes)]
    return _run("closed", [(target, n, seconds, start) for n in counts if n], nice)[0]
