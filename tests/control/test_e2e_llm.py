"""End to end with the real LLM: a real `podium up`, two versions of smollm2-135m-instruct, and a
Red-Black rollout v1 -> v2 while OpenAI-SDK clients keep calling the gateway.

Each instance is a real vLLM engine (~40-120 s to boot on 2 cores), so the rollout runs with one
instance per version and two stages; the whole test stays within a few minutes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from podium.package.cache import ModelCache
from podium.package.defaults import DEFAULT_MODEL
from tests.support.control_cli import podium
from tests.support.llm_up import instances, write_llm
from tests.support.up_process import Up, alive, wait

pytestmark = pytest.mark.engine

BOOT_TIMEOUT_S = 300  # one vLLM instance, possibly booting at nice 10 beside one under load
BOOT_POLL_S = 1.0  # how often a wait for a boot asks the control plane


def gateway_counts(up: Up) -> Counter[tuple[str, str]]:
    """(version, outcome) -> requests, from the gateway's own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(up.gateway + "/metrics", timeout=10).text
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):  # read as Prometheus reads it
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "podium:gateway_requests_total" and \
                    labels.get("model") == DEFAULT_MODEL:
                counts[(labels["version"], labels["outcome"])] += int(sample.value)
    return counts


@dataclass
class Call:
    started: float
    ended: float
    model: str
    error: str = ""


@dataclass
class ChatLoad:
    """`num_clients` threads, each an `openai.OpenAI` client calling chat completions through
    the gateway until stopped, `pause_s` apart. Started together, the clients stay in step
    (the engine batches their requests), so the serving engine idles between bursts: a new
    instance boots at nice 10 on the same 2 cores, and vLLM's worker busy-polls for 1 s after
    each step, so back-to-back clients would leave the new version hardly any CPU to boot."""

    base_url: str
    num_clients: int = 4
    pause_s: float = 2.0
    calls: list[Call] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n in range(self.num_clients):
            thread = threading.Thread(target=self._client, args=(n,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> list[Call]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)
        return self.calls

    def wait_calls(self, count: int, timeout_s: float = 120) -> None:
        wait(lambda: len(self.calls) >= count, what=f"{count} calls (have {len(self.calls)})",
             timeout_s=timeout_s)

    def _client(self, n: int) -> None:
        client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0,
                               timeout=120)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                answer = client.chat.completions.create(
                    model=DEFAULT_MODEL, max_tokens=8, temperature=0,
                    messages=[{"role": "user", "content": f"Say hello to client {n}."}])
                tokens = answer.usage.completion_tokens if answer.usage else 0
                error = "" if answer.choices and tokens > 0 else f"empty answer: {answer}"
                self.calls.append(Call(started, time.monotonic(), answer.model, error))
            except openai.OpenAIError as exc:
                self.calls.append(Call(started, time.monotonic(), "", repr(exc)))
            self._stop.wait(self.pause_s)


@pytest.fixture
def up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_dir: Path) -> Iterator[Up]:
    """`podium up` with its own PODIUM_HOME (store, instance logs) reading the session's model
    cache, so every instance boots from the already materialized weights.

    Its instances' vLLM workers are not pinned to cores: vLLM pins every worker to the same
    first core of the machine, so v2's worker booted (at nice 10) on the core where v1's worker
    serves and busy-polls, and took 90 s instead of 14 to start, with the other core idle."""
    assert default_model_dir.is_dir()
    monkeypatch.setenv("PODIUM_CACHE", str(ModelCache().root))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    u = Up(tmp_path)
    yield u
    pids: list[int] = []
    with contextlib.suppress(httpx.HTTPError, ValueError, AssertionError):
        pids = [i["pid"] for v in ("1", "2") for i in instances(u, v, state=None) if i["pid"]]
    if u.process is not None and u.process.poll() is None:
        u.process.terminate()
        u.process.wait(timeout=120)
    for pid in pids:  # a failed run must not leave an engine behind: its whole session
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_red_black_rollout_of_the_llm_under_openai_clients_drops_no_request(
        up: Up, tmp_path: Path) -> None:
    up.start()
    for version in ("1", "2"):
        assert podium("announce", str(write_llm(tmp_path / "packages", version)),
                      "--api", up.api) == 0
    assert podium("deploy", f"{DEFAULT_MODEL}@1", "--stages", "100", "--analysis-window", "0",
                  "--warm-delay", "0", "--ready-timeout", str(BOOT_TIMEOUT_S),
                  "--api", up.api) == 0
    wait(lambda: up.rollout(1)["status"] != "running", what="v1 deployed",
         timeout_s=BOOT_TIMEOUT_S + 30, interval_s=BOOT_POLL_S)
    assert up.rollout(1)["status"] == "succeeded", up.rollout(1)
    wait(lambda: len(instances(up, "1")) == 1, what="v1 ready")
    [v1] = instances(up, "1")

    load = ChatLoad(up.gateway + "/v1")
    load.start()
    load.wait_calls(8)
    before = gateway_counts(up)
    assert before[("1", "ok")] >= 8 and before[("2", "ok")] == 0

    # 4 clients and two engines share 2 cores: latency is judged loosely (the fake-clock tests
    # pin the latency rule); what this run checks is that no request is dropped
    deployed = httpx.post(up.api + "/v1/rollouts", timeout=30, json={
        "model": DEFAULT_MODEL, "version": "2", "stages": [50, 100], "num_instances": 1,
        # 20 s: at 10 s the whole suite once saw every split request of the 50% stage go to
        # v1 before the gateway routed to v2 (4 clients, 2 s apart, leave few requests)
        "ready_timeout_ms": BOOT_TIMEOUT_S * 1000, "analysis_window_ms": 20_000,
        "min_requests": 4, "max_p99_ratio": 10.0, "p99_slack_ms": 5_000.0,
        "warm_delay_ms": 3_000})
    assert deployed.status_code == 201, deployed.text
    rollout_id = deployed.json()["id"]

    # the 50% stage: both versions serve, by split and explicitly as model@version
    wait(lambda: up.rollout(rollout_id)["weight_new"] == 50
         or up.rollout(rollout_id)["status"] != "running",
         what="the 50% stage", timeout_s=BOOT_TIMEOUT_S + 30, interval_s=BOOT_POLL_S)
    assert up.rollout(rollout_id)["status"] == "running", up.rollout(rollout_id)
    at_50 = gateway_counts(up)
    gateway = openai.OpenAI(base_url=up.gateway + "/v1", api_key="unused", max_retries=0,
                            timeout=120)
    assert {DEFAULT_MODEL, f"{DEFAULT_MODEL}@1", f"{DEFAULT_MODEL}@2"} <= {
        m.id for m in gateway.models.list()}
    for version in ("1", "2"):
        answer = gateway.chat.completions.create(
            model=f"{DEFAULT_MODEL}@{version}", max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": "Name a colour."}])
        assert answer.choices[0].message.content
    wait(lambda: up.rollout(rollout_id)["weight_new"] != 50, what="the end of the 50% stage",
         timeout_s=120)
    at_100 = gateway_counts(up)

    wait(lambda: up.rollout(rollout_id)["status"] != "running", what="the rollout",
         timeout_s=120)
    record = up.rollout(rollout_id)
    assert record["status"] == "succeeded", record
    wait(lambda: instances(up, "1", state=None) == []
         or all(i["state"] == "stopped" for i in instances(up, "1", state=None)),
         what="v1 drained and stopped", timeout_s=90)
    wait(lambda: not alive(v1["pid"]), what="v1's process gone", timeout_s=30)
    after_rollout = gateway_counts(up)
    load.wait_calls(len(load.calls) + 8)
    calls = load.stop()
    end = gateway_counts(up)

    assert [c for c in calls if c.error] == []
    assert len(calls) >= 24
    assert {c.model for c in calls} == {DEFAULT_MODEL}  # the gateway answers as `name`
    # over the 50% stage the split sent the clients' requests to both versions (beyond the
    # one explicit model@version call each)
    for version in ("1", "2"):
        assert at_100[(version, "ok")] - at_50[(version, "ok")] >= 3, (at_50, at_100)
    # nothing failed at the gateway; once the rollout was done every request went to v2
    assert end[("1", "error")] == end[("2", "error")] == 0, end
    assert end[("1", "ok")] == after_rollout[("1", "ok")]
    assert end[("2", "ok")] >= after_rollout[("2", "ok")] + 4
    assert len(instances(up, "2")) == 1
    assert up.status()["models"][DEFAULT_MODEL]["splits"] == {"2": 100}
