"""Where a request's time goes, from a server's side: before its head was parsed, inside the
server, after the answer was written.

The load generator stamps each request with its send time (`rawload`'s `stamp`: the
`x-bench-sent` header, CLOCK_MONOTONIC nanoseconds, one clock for every process of the
machine). A server process run by a bench records, per request, that stamp, when its head was
parsed (`head_complete` of the HTTP protocol, `timed_protocol`) and when its answer was
written (an early answer) or began (`TimedApp`: the app's `http.response.start`), and how late
its event loop woke (`loop_lag`). Joined by stamp with the client's own figures
(`breakdown`), a refusal's time splits into:

- `before_head`: sent to head parsed: the kernel, the accept queue, and the server's event loop
  busy with other work (or the server's process waiting for a core);
- `inside`: head parsed to answer written;
- `after`: answer written to read by the client: the client's own loop and core.

Over the same window, the share of time the server's loop thread ran on a core and the share
it was runnable but waited for one (`/proc/thread-self/schedstat`): a loop that waits for a
core is late for every request, however cheap each is.

Bench code only: the server process is the bench's own child (`overload_xgb`'s gateway).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bench.harness.rawload import SENT_HEADER
from bench.harness.stats import median, percentile

RECORDS: list[tuple[int, int, int, int]] = []
"""(stamp, head parsed, answer written or begun, status) in monotonic ns, this process's."""
LAGS: list[tuple[float, float]] = []
"""(monotonic s, how late the event loop woke for a 5 ms timer in s), every wake-up."""
SCHED: list[tuple[float, int, int]] = []
"""(monotonic s, CPU ns, ns waiting for a core while runnable) of the loop's thread, from
`/proc/thread-self/schedstat`, every 100 ms."""


def timed_protocol(base: type) -> type:
    """A subclass of `base` (a uvicorn httptools protocol, `edge.early`'s or not) recording
    each stamped request's head time, and an early answer's write."""

    class TimedProtocol(base):  # type: ignore[valid-type,misc]
        _bench: tuple[int, int] | None = None

        def head_complete(self) -> None:
            head = time.monotonic_ns()
            stamp = next((int(v) for k, v in self.headers if k == SENT_HEADER), 0)
            super().head_complete()
            if getattr(self, "_early", None) is not None:
                self._bench = (stamp, head)  # answered from the head: at its write
            elif self.scope is not None:
                self.scope["bench.times"] = (stamp, head)

        def _answer_early(self) -> None:
            times, self._bench = self._bench, None
            super()._answer_early()
            if times is not None:
                RECORDS.append((*times, time.monotonic_ns(), 429))

    return TimedProtocol


class TimedApp:
    """An ASGI app around `app` recording when each stamped request's answer began."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        times = scope.get("bench.times") if scope["type"] == "http" else None
        if times is None:
            return await self.app(scope, receive, send)

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                RECORDS.append((*times, time.monotonic_ns(), message["status"]))
            await send(message)

        return await self.app(scope, receive, timed_send)


async def loop_lag(every_s: float = 0.005) -> None:
    """Record how late the loop wakes for a timer, and every 20th wake-up the thread's CPU
    time and run-queue wait, forever (run as a task)."""
    stats = Path("/proc/thread-self/schedstat")
    wakes = 0
    while True:
        due = time.monotonic() + every_s
        await asyncio.sleep(every_s)
        now = time.monotonic()
        LAGS.append((now, now - due))
        wakes += 1
        if wakes % 20 == 0 and stats.exists():
            cpu, waited, _ = stats.read_text().split()
            SCHED.append((now, int(cpu), int(waited)))


def dump(path: Path) -> None:
    """Write what this process recorded (at its exit)."""
    path.write_text(json.dumps({"records": RECORDS, "lags": LAGS, "sched": SCHED}))


def _ms(values: list[float]) -> str:
    """median / p99 / max in ms, or '-'."""
    if not values:
        return "-"
    return (f"{median(values) * 1e3:.1f}/{percentile(values, 99) * 1e3:.1f}/"
            f"{max(values) * 1e3:.1f}")


def breakdown(client: list[tuple[int, int, float]], path: Path,
              window: tuple[float, float]) -> dict[str, Any]:
    """The client's answers (stamp, status, seconds) of a phase joined with what the server
    recorded (`dump`'s file): median/p99/max ms of each part, for refusals (429) and admitted
    (200); the server's loop lag over the phase's `window` (monotonic seconds); how many of
    the client's answers the server had no record of (a connection that failed, or a request
    the server had not parsed)."""
    data = json.loads(path.read_text())
    server = {stamp: (head, done) for stamp, head, done, _ in data["records"] if stamp}
    parts: dict[int, dict[str, list[float]]] = {429: {}, 200: {}}
    unmatched = 0
    for stamp, status, seconds in client:
        if status not in parts:
            continue
        if stamp not in server:
            unmatched += 1
            continue
        head, done = server[stamp]
        received = stamp + seconds * 1e9
        for name, value in (("before_head", head - stamp), ("inside", done - head),
                            ("after", received - done)):
            parts[status].setdefault(name, []).append(value / 1e9)
    out: dict[str, Any] = {"server_unmatched": unmatched}
    for status, name in ((429, "refusal"), (200, "admitted")):
        for part, values in parts[status].items():
            out[f"{name}_{part}_ms"] = _ms(values)
    out["server_loop_lag_ms"] = _ms([lag for at, lag in data["lags"]
                                     if window[0] <= at <= window[1]])
    sched = [row for row in data.get("sched", []) if window[0] <= row[0] <= window[1]]
    if len(sched) >= 2:  # shares of the window: on a core, and runnable but waiting for one
        (t0, cpu0, wait0), (t1, cpu1, wait1) = sched[0], sched[-1]
        out["server_cpu_share"] = round((cpu1 - cpu0) / 1e9 / (t1 - t0), 3)
        out["server_runqueue_share"] = round((wait1 - wait0) / 1e9 / (t1 - t0), 3)
    return out
