"""Count the real vLLM engines a test run starts, and which test started each.

Off unless `PODIUM_TEST_ENGINE_LOG=FILE` is set: then a thread polls the process table every
0.25 s for vLLM's engine core (the process titled `VLLM::EngineCore...`, started by every
`AsyncLLM` or `LLM`: a `podium serve` of an LLM or embedder, a `podium up` instance, a Ray
actor, an in-process probe) that descends from this run (this process, or a process whose
environment carries the run's token, is among its ancestors), and appends one line per new
engine to FILE: `<test node id>\t<pid>`. An engine core forked from Podium's preloader keeps
the preloader's process name, so it is found by its worker (`VLLM::Worker...`: titled by
vLLM when spawned, named so by `podium.preload.worker` when forked): the worker's parent is
the engine core. An engine core lives for
the whole boot (tens of seconds), so none is missed. The token is set in `os.environ` before
any test runs, so every process the run spawns inherits it; engines of other runs on the
machine are not counted. The file is appended to, never truncated (the fast tier's processes
and the rest's write to one file): remove it before a run. Under pytest-xdist only the workers
count (the controller runs no test, and would log each engine a second time, as `collection`).

    PODIUM_TEST_ENGINE_LOG=/tmp/engines.txt python -m pytest tests -m engine
    cut -f1 /tmp/engines.txt | sort | uniq -c
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

LOG_ENV = "PODIUM_TEST_ENGINE_LOG"
TOKEN_ENV = "PODIUM_TEST_ENGINE_RUN"
TITLE = "VLLM::EngineCore"
WORKER = "VLLM::Worker"


class EngineCounter:
    """Polls for engine cores of this run; `current` names the test running now."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.token = uuid.uuid4().hex
        os.environ[TOKEN_ENV] = self.token
        self.current = "collection"
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-counter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()  # one last look

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._poll()

    def _poll(self) -> None:
        import psutil

        marker = f"{TOKEN_ENV}={self.token}".encode()
        for proc in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
            engine = self._engine_pid(proc.info)
            # a test process is never an engine: tests/preload/test_worker.py forks a child
            # that names itself `VLLM::Worker`, whose parent is the test process
            if engine is None or engine == os.getpid() or engine in self.seen:
                continue
            if not self._ours(proc, marker):
                continue
            pid = engine
            self.seen.add(pid)
            with self.log.open("a") as out:
                out.write(f"{self.current}\t{pid}\n")


    @staticmethod
    def _engine_pid(info: dict) -> int | None:
        """The engine core's pid when `info` is an engine core (titled by vLLM) or its worker
        (whose parent is the engine core, titled or forked from the preloader)."""
        title = " ".join(info["cmdline"] or [])
        name = info["name"] or ""
        if title.startswith(TITLE) or name.startswith(TITLE[:15]):
            return info["pid"]
        if title.startswith(WORKER) or name.startswith(WORKER):
            return info["ppid"]
        return None

    @staticmethod
    def _ours(proc, marker: bytes) -> bool:  # type: ignore[no-untyped-def]
        """Started by this run: this process is an ancestor, or an ancestor's environment has
        the token (the engine core's own is unreadable: vLLM's process title overwrites it)."""
        import psutil

        try:
            ancestors = proc.parents()
        except psutil.Error:
            return False
        for ancestor in ancestors:
            if ancestor.pid == os.getpid():
                return True
            try:
                if marker in Path(f"/proc/{ancestor.pid}/environ").read_bytes().split(b"\0"):
                    return True
            except OSError:
                continue
        return False


def from_environment() -> EngineCounter | None:
    path = os.environ.get(LOG_ENV)
    return EngineCounter(Path(path)) if path else None
