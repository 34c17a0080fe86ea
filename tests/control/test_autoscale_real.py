"""The real LLM autoscaled on vLLM's own queue under a real `podium up`: 1 → 2 under load, back
to 1 after the cooldown.

The package is the default LLM with `max_num_seqs=2`, so six clients leave requests waiting
in the engine (`vllm:num_requests_waiting`), and an in-flight target too high to trigger: only
the engine's signal, read from the instance's /metrics, can scale it up. The load stops once the
second instance is asked for, so it boots on quiet cores; then the cooldown takes it away.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podium.package.cache import ModelCache
from podium.package.defaults import DEFAULT_MODEL
from podium.package.package import write_manifest
from tests.support.control_cli import podium
from tests.support.llm_up import instances, write_llm
from tests.support.up_process import Up, alive, wait

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

BOOT_TIMEOUT_S = 600  # one vLLM instance: ~40 s on a quiet machine, 300+ s at load average 20
COOLDOWN_MS = 10_000
REQUEST = {"model": DEFAULT_MODEL, "max_tokens": 32, "temperature": 0,
           "messages": [{"role": "user", "content": "Count from one to twenty."}]}


def scaled_llm(root: Path) -> Path:
    """The default LLM (as version 1) that queues past 2 running requests and scales on it."""
    manifest_path = write_llm(root, "1") / "podium.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["engine_args"] = {**manifest["engine_args"], "max_num_seqs": 2}
    manifest["autoscale"] = {"target_waiting": 1, "target_in_flight": 64,
                             "scale_up_window_ms": 2_000, "scale_down_cooldown_ms": COOLDOWN_MS}
    return write_manifest(manifest_path.parent, manifest).root


class Load:
    """`num_clients` threads posting chat completions to the gateway back to back."""

    def __init__(self, url: str, num_clients: int = 6) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.num_timeouts = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True)
                         for _ in range(num_clients)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> list[int]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)
        return self.statuses

    def _client(self) -> None:
        with httpx.Client(timeout=300) as client:
            while not self._stop.is_set():
                try:
                    self.statuses.append(client.post(self.url + "/v1/chat/completions",
                                                     json=REQUEST).status_code)
                except httpx.TimeoutException:
                    # queued behind 2 running requests on 2 cores other engines share: slow is
                    # not wrong (a refused or failed request is, below)
                    self.num_timeouts += 1
                except httpx.HTTPError as exc:
                    self.statuses.append(-1)
                    print(f"load request failed: {exc!r}")


@pytest.fixture
def up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_dir: Path) -> Iterator[Up]:
    """`podium up` reading the session's model cache; no engine is left behind."""
    assert default_model_dir.is_dir()
    monkeypatch.setenv("PODIUM_CACHE", str(ModelCache().root))
    u = Up(tmp_path)
    yield u
    pids: list[int] = []
    with contextlib.suppress(httpx.HTTPError, ValueError, AssertionError):
        pids = [i["pid"] for i in instances(u, "1", state=None) if i["pid"]]
    if u.process is not None and u.process.poll() is None:
        u.process.terminate()
        u.process.wait(timeout=120)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def num_desired(up: Up) -> int:
    return up.status()["models"][DEFAULT_MODEL]["versions"]["1"]["num_desired"]


def scale_events(up: Up) -> list[str]:
    events = up.get(f"/v1/events?model={DEFAULT_MODEL}&limit=100")
    assert isinstance(events, list)
    return [e["message"] for e in reversed(events) if e["kind"] == "scale"]


def test_an_llm_scales_to_two_on_waiting_requests_and_back_to_one(
        up: Up, tmp_path: Path) -> None:
    up.start()
    assert podium("announce", str(scaled_llm(tmp_path / "packages")), "--api", up.api) == 0
    assert podium("deploy", f"{DEFAULT_MODEL}@1", "--stages", "100", "--analysis-window", "0",
                  "--warm-delay", "0", "--ready-timeout", str(BOOT_TIMEOUT_S),
                  "--api", up.api) == 0
    wait(lambda: up.rollout(1)["status"] != "running", what="v1 deployed",
         timeout_s=BOOT_TIMEOUT_S + 30)
    assert up.rollout(1)["status"] == "succeeded", up.rollout(1)
    wait(lambda: len(instances(up, "1")) == 1, what="v1 ready")
    assert podium("scale", f"{DEFAULT_MODEL}@1", "--min", "1", "--max", "2",
                  "--api", up.api) == 0
    assert num_desired(up) == 1

    load = Load(up.gateway)
    load.start()
    try:
        wait(lambda: num_desired(up) == 2, what="the autoscaler asking for a second instance",
             timeout_s=120)
    finally:
        statuses = load.stop()
    [up_event] = [m for m in scale_events(up) if "autoscale" in m]
    assert up_event.startswith(f"{DEFAULT_MODEL}@1 -> 2 (autoscale: waiting "), up_event
    assert statuses and set(statuses) == {200}, (statuses, load.num_timeouts)

    wait(lambda: len(instances(up, "1")) == 2, what="the second instance ready",
         timeout_s=BOOT_TIMEOUT_S)
    # idle now: after the cooldown (counted from the moment both serve) one instance goes
    wait(lambda: num_desired(up) == 1, what="the scale-down after the cooldown",
         timeout_s=COOLDOWN_MS / 1000 + 60)
    wait(lambda: len(instances(up, "1", state=None)) == 1, what="one instance drained, stopped",
         timeout_s=90)
    assert scale_events(up)[-1] == (f"{DEFAULT_MODEL}@1 -> 1 (autoscale: in_flight 0/instance "
                                    "< target 64, waiting 0/instance < target 1)")
    r = httpx.post(up.gateway + "/v1/chat/completions", json=REQUEST, timeout=120)
    assert r.status_code == 200, r.text
