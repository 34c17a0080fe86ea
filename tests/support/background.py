"""Subprocesses a test session starts in the background at its first test, for fixtures that
read what they computed later (`tests/conftest.py`, `_early_engine_runs`): each is one process
that computes on about one core, started where the session's first tests wait for the shared
instance's announce and boot, at nice NICE so that what the next tests wait for keeps the CPU
and the job takes only what it leaves (it finishes during the tests after them).

One job per name a session; a fixture asking for a job that was not started early starts it
then. A job still running when the session ends is killed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.harness import ROOT

NICE = 10
TIMEOUT_S = 1500


@dataclass
class Job:
    """A background command: its stdout to `out`, its stderr to `log`."""

    name: str
    process: subprocess.Popen[bytes]
    out: Path
    log: Path

    def stdout(self, timeout_s: float = TIMEOUT_S) -> str:
        """What the command printed, once it exited 0."""
        try:
            returncode = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.name} took over {timeout_s} s: {self._tail()}") from None
        assert returncode == 0, f"{self.name} exited {returncode}: {self._tail()}"
        return self.out.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=60)

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


_jobs: dict[str, Job] = {}


def start(name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> Job:
    """The session's job `name`: started now (`argv` at nice NICE, in the repository root), or
    the one already started."""
    if name in _jobs:
        return _jobs[name]
    out, log = workdir / f"{name}.out", workdir / f"{name}.log"
    with out.open("wb") as stdout, log.open("wb") as stderr:
        process = subprocess.Popen(["nice", "-n", str(NICE), *argv], stdout=stdout,
                                   stderr=stderr, env=env if env is not None else os.environ,
                                   cwd=ROOT)
    _jobs[name] = Job(name, process, out, log)
    return _jobs[name]


def stop_all() -> None:
    """Kill the jobs still running (the session ends)."""
    for job in _jobs.values():
        job.stop()
