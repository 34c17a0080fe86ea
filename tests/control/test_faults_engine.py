"""The real LLM's engine process killed with `kill -9` under load, behind `podium up`.

One instance of the default LLM: its engine core (vLLM's `EngineCore` child process) is killed
while clients call the gateway. The instance reports not-ready at once and exits, and the
control plane restarts it; requests in flight fail with a clear 5xx naming the dead engine, the
ones sent while no instance is ready get a fast 503 saying so, nothing hangs, and requests
succeed again once the restarted instance is ready.

One instance, not two: two vLLM engines booting side by side on this 2-core machine took 325 s
to be ready (and the restart as long again), past what one test may cost in CI. Routing around
a dead instance to a live one is the gateway's own path, tested without an engine.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from podium.package.cache import ModelCache
from podium.package.defaults import DEFAULT_MODEL
from tests.support.control_cli import podium
from tests.support.llm_up import instances, write_llm
from tests.support.up_process import Up, wait

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]  # two boots on a busy machine

BOOT_TIMEOUT_S = 600  # one vLLM instance: ~40 s on a quiet machine, 325 s at load average 30
BOOT_POLL_S = 1.0  # how often a wait for a boot asks the control plane
OUT_OF_ROUTING_S = 3.0  # a supervisor pass (0.5 s) probing readiness, with room for a busy box
REQUEST = {"model": DEFAULT_MODEL, "max_tokens": 24, "temperature": 0,
           "messages": [{"role": "user", "content": "Count from one to twenty."}]}


@dataclass
class Call:
    started: float
    ended: float
    status: int
    text: str = ""


@dataclass
class Load:
    """`num_clients` threads posting chat completions to the gateway back to back."""

    url: str
    num_clients: int = 4
    calls: list[Call] = field(default_factory=list)
    num_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for _ in range(self.num_clients):
            self._threads.append(threading.Thread(target=self._client, daemon=True))
            self._threads[-1].start()

    def stop(self) -> list[Call]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)
        return self.calls

    def _client(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                with self._lock:
                    self.num_in_flight += 1
                try:
                    r = client.post(self.url + "/v1/chat/completions", json=REQUEST)
                    self.calls.append(Call(started, time.monotonic(), r.status_code,
                                           "" if r.status_code == 200 else r.text[:300]))
                except httpx.HTTPError as exc:
                    self.calls.append(Call(started, time.monotonic(), 0, repr(exc)))
                finally:
                    with self._lock:
                        self.num_in_flight -= 1
                self._stop.wait(0.2)


def engine_core(pid: int) -> psutil.Process:
    """The vLLM engine core process under the instance `pid`."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no EngineCore process under instance pid {pid}")


@pytest.fixture
def llm_up(up: Up, monkeypatch: pytest.MonkeyPatch, default_model_dir: Path) -> Iterator[Up]:
    """`podium up` reading the session's model cache (the weights are materialized once)."""
    assert default_model_dir.is_dir()
    monkeypatch.setenv("PODIUM_CACHE", str(ModelCache().root))
    yield up
    pids = []
    if up.process is not None and up.process.poll() is None:
        pids = [i["pid"] for i in instances(up, "1", state=None) if i["pid"]]
        up.process.terminate()
        up.process.wait(timeout=120)
    for pid in pids:  # a failed run leaves no engine behind
        if psutil.pid_exists(pid):
            os.killpg(pid, signal.SIGKILL)


def _ready(url: str) -> int:
    try:
        return httpx.get(url + "/health/ready", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_engine_killed_under_load_fails_in_flight_requests_clearly_and_is_restarted(
        llm_up: Up, tmp_path: Path) -> None:
    up = llm_up
    up.start()
    assert podium("announce", str(write_llm(tmp_path / "packages", "1")), "--api", up.api) == 0
    assert podium("deploy", f"{DEFAULT_MODEL}@1", "--stages", "100", "--analysis-window", "0",
                  "--warm-delay", "0", "--ready-timeout", str(BOOT_TIMEOUT_S),
                  "--api", up.api) == 0
    wait(lambda: up.rollout(1)["status"] != "running", what="v1 deployed",
         timeout_s=BOOT_TIMEOUT_S + 30, interval_s=BOOT_POLL_S)
    assert up.rollout(1)["status"] == "succeeded", up.rollout(1)
    [victim] = instances(up, "1")
    victim_url = f"http://127.0.0.1:{victim['http_port']}"
    core = engine_core(victim["pid"])

    load = Load(up.gateway)
    load.start()
    wait(lambda: len(load.calls) >= 4, what="calls before the kill", timeout_s=180)
    # the clients run in step: kill while a batch is in the engine, not between two
    wait(lambda: load.num_in_flight == load.num_clients, what="requests in flight")
    time.sleep(0.3)
    core.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    # the instance says so at once (or is already gone): never ready with a dead engine
    wait(lambda: _ready(victim_url) != 200, what="the instance not ready", timeout_s=2)
    not_ready_s = time.monotonic() - killed_at

    wait(lambda: any(i["num_restarts"] == 1 for i in instances(up, "1")),
         what="the instance restarted and ready", timeout_s=BOOT_TIMEOUT_S,
         interval_s=BOOT_POLL_S)
    restarted_at = time.monotonic()
    count = len(load.calls)
    wait(lambda: len(load.calls) >= count + 4, what="calls after the restart", timeout_s=180)
    calls = load.stop()

    [again] = instances(up, "1")
    assert again["id"] == victim["id"] and again["pid"] != victim["pid"]
    failed = [c for c in calls if c.status != 200]
    assert failed, "the kill must have cost the requests in flight"
    for call in failed:  # none hangs, each says why
        assert call.status in (502, 503), call
        assert call.ended - max(call.started, killed_at) < 30, call
    in_flight = [c for c in failed if c.started < killed_at]
    assert in_flight and all("engine" in c.text or "failed mid-request" in c.text
                             for c in in_flight), in_flight
    # out of routing within a pass: refused by the gateway at once, naming the model
    refused = [c for c in failed if c.started > killed_at + OUT_OF_ROUTING_S]
    assert all("no ready instance" in c.text or "no version taking traffic" in c.text
               for c in refused), refused
    assert all(c.ended - c.started < 5 for c in refused), refused
    assert all(c.status == 200 for c in calls if c.started > restarted_at)
    print(f"not ready after {not_ready_s:.2f} s; {len(failed)} failed of {len(calls)}: "
          f"{sorted({(c.status, c.text[:100]) for c in failed})}")
