"""Where a phase's CPU went: each server process's share of a core and of its wait for one, and
each core's busy share, sampled from /proc while a bench runs.

A sample is (monotonic s, {name: (CPU s, run-queue wait s, preemptions)} per process, summed
over its threads, {cpu: busy s} per core). `shares` turns the first and last samples inside a
window into shares of the window: a process's CPU and wait for a core (the time its threads
were runnable but not running: on one shared core, the starvation every request in it waits
out), its preemptions a second (involuntary context switches: each a cold cache after), and
each core's busy share. What ran on a server core beyond the named processes is its busy
share minus theirs (other sessions' work on a shared machine, the kernel's softirqs).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")

Sample = tuple[float, dict[str, tuple[float, float, int]], dict[str, float]]


def process_times(pid: int) -> tuple[float, float, int]:
    """(CPU s, run-queue wait s, involuntary context switches) of a process, summed over its
    threads; zeros once it is gone."""
    cpu = wait = switches = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0, 0.0, 0
    for task in tasks:
        try:
            ran, waited, _ = (task / "schedstat").read_text().split()
            status = (task / "status").read_text()
        except (OSError, ValueError):
            continue
        cpu += int(ran)
        wait += int(waited)
        switches += int(status.rsplit("nonvoluntary_ctxt_switches:", 1)[1].split()[0])
    return cpu / 1e9, wait / 1e9, switches


def core_busy() -> dict[str, float]:
    """Busy seconds of each core (/proc/stat: everything but idle and iowait)."""
    busy: dict[str, float] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(f) for f in fields]
            busy[name] = (sum(ticks[:8]) - ticks[3] - ticks[4]) * TICK_S
    return busy


def sample(pids: dict[str, int]) -> Sample:
    """One sample of the named processes and of every core."""
    return (time.monotonic(), {name: process_times(pid) for name, pid in pids.items()},
            core_busy())


def shares(samples: list[Sample], window: tuple[float, float]) -> dict[str, float]:
    """Shares of the window (first to last sample inside it): `NAME_cpu` and `NAME_wait` of
    each process, `NAME_preempted` (a second), `cpuN_busy` of each core; empty with fewer
    than two samples."""
    inside = [s for s in samples if window[0] <= s[0] <= window[1]]
    if len(inside) < 2:
        return {}
    (t0, procs0, cores0), (t1, procs1, cores1) = inside[0], inside[-1]
    span = t1 - t0
    out: dict[str, float] = {}
    for name, (cpu, wait, switches) in procs1.items():
        cpu0, wait0, switches0 = procs0.get(name, (cpu, wait, switches))
        out[f"{name}_cpu"] = round((cpu - cpu0) / span, 3)
        out[f"{name}_wait"] = round((wait - wait0) / span, 3)
        out[f"{name}_preempted"] = round((switches - switches0) / span)
    for core, busy in cores1.items():
        out[f"{core}_busy"] = round((busy - cores0.get(core, busy)) / span, 3)
    return out
