"""Server processes for benchmarks: start-and-wait-ready, a clean bounded stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.loops import check_loopback

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: `python -m bench.NAME` runs from here."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def module_command(module: str, *args: str) -> list[str]:
    """`python -m module args...` with this interpreter: how a bench starts itself as a child
    (its gateway, its server); `serve` puts the repository root on the child's path."""
    return [sys.executable, "-m", module, *args]


def wait_until(condition: Callable[[], bool], timeout_s: float = 120, poll_s: float = 0.2,
               what: str = "condition") -> None:
    """Poll `condition` until true; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout_s} s")
        time.sleep(poll_s)


@dataclass
class Served:
    """A running server: its process, seconds from start to ready, the ready answer."""

    process: subprocess.Popen[bytes]
    boot_s: float
    ready: httpx.Response
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    merged = {**os.environ, **(env or {})}
    path = [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in path:  # so `python -m bench.X` children import `bench` from any cwd
        path.append(str(ROOT))
    merged["PYTHONPATH"] = os.pathsep.join(path)
    return merged


def _tree(pid: int) -> list:  # list[psutil.Process]
    import psutil

    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def kill_tree(process: subprocess.Popen[bytes], descendants: list | None = None) -> None:
    """SIGKILL the process and every descendant (those found now, plus `descendants`)."""
    import psutil

    for child in [*_tree(process.pid), *(descendants or [])]:
        with contextlib.suppress(psutil.Error):
            child.kill()
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait()


def stop(process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """SIGTERM the process and wait up to `timeout_s`; then whatever of its tree is still
    alive (an engine core it did not reap, a worker) is SIGKILLed, so nothing outlives a run."""
    import psutil

    descendants = _tree(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(process, descendants)
            return
    _gone, alive = psutil.wait_procs(descendants, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _exit_on_sigterm() -> None:
    """Make SIGTERM (`timeout`, a supervisor) raise SystemExit in the bench, as Ctrl-C raises
    KeyboardInterrupt, so `serve`'s cleanup runs and no server outlives the bench. Only where
    SIGTERM still has its default action and only in the main thread."""
    import threading

    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        def terminate(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, terminate)


def _tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-3000:]
    return ""


@contextlib.contextmanager
def serve(command: list[str], ready_url: str, *, timeout_s: float = 120,
          log: Path | None = None, env: dict[str, str] | None = None, cwd: Path | None = None,
          poll_s: float = 0.25, stop_timeout_s: float = 30) -> Iterator[Served]:
    """Run `command` for the block. Ready means GET `ready_url` answers 200 within `timeout_s`
    (RuntimeError with the log's tail if the process exits first or the bound passes, and the
    process tree is killed). Afterwards it is stopped with `stop`. Output goes to `log` (a
    temporary file by default). The child has its own session, so a Ctrl-C reaches only the
    bench, which then stops its servers; a SIGTERM to the bench does the same."""
    check_loopback(ready_url)
    _exit_on_sigterm()
    if log is None:
        fd, name = tempfile.mkstemp(prefix=f"bench-{Path(command[0]).name}-", suffix=".log")
        os.close(fd)
        log = Path(name)
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=_child_env(env), start_new_session=True)
    try:
        deadline = started + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{' '.join(command[:4])} exited with {process.returncode}; "
                                   f"log {log}:\n{_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(ready_url, timeout=5)
                if answer.status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(command[:4])} not ready after {timeout_s} s; "
                                   f"log {log}:\n{_tail(log)}")
            time.sleep(poll_s)
    except BaseException:
        kill_tree(process)
        raise
    try:
        yield Served(process, time.monotonic() - started, answer, log)
    finally:
        stop(process, stop_timeout_s)
