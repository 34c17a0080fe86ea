"""The suite's second real instance of the default LLM (the session's `spare_instance`), for
the tests that need one beside the shared `instance` and may end it: a gateway in front of two
instances (tests/gateway/test_prefix_real.py), Triton's vLLM backend and BLS on the real engine
(tests/triton/test_llm_real.py), then a drain on SIGTERM that stops it
(tests/server/test_shutdown.py). One engine start serves them all; if a test ends it before
another asks (a run in another order), the next `get` boots it again.

It serves a Triton model repository (tests/support/triton_runtimes.py): the default LLM as a
vLLM-backend model (`1/model.json` pointing at its cached folder, so the same weights and
engine as the default package) and `bls_llm`, a Python model calling it through BLS.

No API key (every route open, the log says so), /metrics open, its own process group (a test
may signal the group, as Ctrl-C or `timeout` do), a 60 s drain, constraints compiled in a
thread (`PODIUM_CONSTRAINT_COMPILER=thread`; the shared instance runs the default worker), its
engine worker's OpenMP threads chosen by the platform's default (`PODIUM_WORKER_THREADS=auto`:
a team on every core of this 2-core kind; the suite's other instances run one thread, see
tests/conftest.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.harness import RunningInstance, start_instance

SPARE_ENV = {"PODIUM_CONSTRAINT_COMPILER": "thread", "PODIUM_WORKER_THREADS": "auto"}


@dataclass(frozen=True)
class BootSeen:
    """What the HTTP port answered the first time it answered, while the engine loaded."""

    live_status: int
    ready_status: int
    ready_body: dict


@dataclass
class Spare:
    root: Path
    _running: RunningInstance | None = None
    _boot: BootSeen | None = None
    _boots: int = field(default=0)

    def get(self) -> RunningInstance:
        """The spare instance, ready (booted now if it never was or was ended)."""
        if self._running is None or self._running.process.poll() is not None:
            self._running, self._boot = self._start()
        return self._running

    def take(self) -> tuple[RunningInstance, BootSeen]:
        """The spare instance for a test that ends it (a later `get` boots another)."""
        running, seen = self.get(), self._boot
        assert seen is not None
        self._running, self._boot = None, None
        return running, seen

    def stop(self) -> None:
        if self._running is not None:
            self._running.stop()

    def _start(self) -> tuple[RunningInstance, BootSeen]:
        from podium.package.defaults import DEFAULT_MODEL, default_model_dir
        from tests.support.triton_runtimes import write_llm_repository

        self._boots += 1
        folder = self.root / f"boot-{self._boots}"
        repository = write_llm_repository(folder / "triton-repo", DEFAULT_MODEL,
                                          default_model_dir())
        running = start_instance(["--repository", str(repository), "--metrics-open",
                                  "--shutdown-timeout", "60"],
                                 folder / "instance.log", new_session=True, env=SPARE_ENV)
        try:
            seen = _first_answer(running)
            running.wait_ready()
        except BaseException:
            running.stop()
            raise
        return running, seen


def _first_answer(running: RunningInstance, timeout_s: float = 60) -> BootSeen:
    """Liveness and readiness the first time the port answers (the engine is still loading:
    it takes tens of seconds, the HTTP port opens first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert running.process.poll() is None, running.log()[-4000:]
        try:
            live = httpx.get(f"{running.http_url}/health", timeout=2)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        ready = httpx.get(f"{running.http_url}/health/ready", timeout=5)
        return BootSeen(live.status_code, ready.status_code, ready.json())
    raise AssertionError(f"the HTTP port never answered in {timeout_s} s:\n{running.log()}")
