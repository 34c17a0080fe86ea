"""End to end with the real LLM (smollm2-135m-instruct) under ONE real `podium up`: autoscaling
on vLLM's own queue, scale to zero and back on held requests, the engine killed under load and
restarted, and a Red-Black rollout v1 -> v2 under OpenAI-SDK clients.

Each instance is a real vLLM engine (~40-120 s to boot on 2 cores, 300+ s at load average 20),
so the three scenarios share the control plane and its v1 instance and run in this order (each
leaves one ready v1 instance for the next): v1 deployed (1 engine start), scaled to 2 and back
(1), to zero and back (1), its engine killed and the instance restarted (1), rolled out to v2
(1): five engine starts where separate `podium up`s took seven. Every instance, the first
included (it waits for the zygote's import), forks from the local runtime's zygote
(`podium.preload.zygote`): no import of vLLM on its boot.
A scenario that fails leaves the next to fail too:
read the first failure.

v1 is the default LLM with `max_num_seqs=2` and an autoscale policy on `num_requests_waiting`
(an in-flight target too high to trigger, so only the engine's signal scales it); its scaling
range is 1..2 during the autoscale scenario only. v2 is the default LLM as written by
`write_llm`, with LoRA adapters on; the last scenario rolls adapters out on it (no engine
start: they run on v2's instance).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from podium.package.cache import ModelCache
from podium.package.defaults import DEFAULT_MODEL
from podium.package.package import write_manifest
from tests.support.cold_start import Sent, burst, cold_start_waits, trickle
from tests.support.control_cli import podium
from tests.support.llm_load import ChatLoad, PostLoad, engine_core, gateway_counts
from tests.support.llm_up import instances, write_llm
from tests.support.lora_rollout import (
    adapter_package,
    break_stored_adapter,
    forget_stored_adapter,
    rollout,
    with_lora,
)
from tests.support.up_process import Up, alive, wait

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

BOOT_TIMEOUT_S = 600  # one vLLM instance: ~40 s on a quiet machine, 325 s at load average 30
BOOT_POLL_S = 1.0  # how often a wait for a boot asks the control plane
COOLDOWN_MS = 6_000  # idle this long (both instances ready) before scaling down
COLD_START_WAIT_S = 3  # how long the gateway holds a request at zero (scale-to-zero scenario)
BURST = 12  # requests arriving at once at zero instances
BOUND_SLACK_S = 30.0  # a refusal at the cold-start bound, answered on a busy 2-core machine
OUT_OF_ROUTING_S = 3.0  # a supervisor pass (0.5 s) probing readiness, with room for a busy box
REQUEST = {"model": DEFAULT_MODEL, "max_tokens": 24, "temperature": 0,
           "messages": [{"role": "user", "content": "Count from one to twenty."}]}
LLM_ROLLOUT_JUDGING = {"analysis_window_ms": 8_000, "min_requests": 6,
                       "evidence_wait_ms": 240_000}
"""Each stage of v1 -> v2 is judged on at least 6 answered requests of v2 (the split is a
smooth round robin: v1 answers as many beside them). A fixed 20 s window stood in for that
evidence before (at 10 s the whole suite once saw every split request of the 50% stage go to
v1 before the gateway routed to v2: 4 clients, 2 s apart, leave few requests); the evidence
wait ends a stage as soon as it has them (~20 s less over the two stages)."""


def scaled_llm(root: Path) -> Path:
    """The default LLM (as version 1) that queues past 2 running requests and scales on it."""
    manifest_path = write_llm(root, "1") / "podium.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["engine_args"] = {**manifest["engine_args"], "max_num_seqs": 2}
    manifest["autoscale"] = {"target_waiting": 1, "target_in_flight": 64,
                             "scale_up_window_ms": 2_000, "scale_down_cooldown_ms": COOLDOWN_MS}
    return write_manifest(manifest_path.parent, manifest).root


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Up]:
    """`podium up` with its own PODIUM_HOME (store, instance logs) reading the session's model
    cache, v1 and v2 announced and v1 deployed (one ready instance); no engine is left behind.

    Its instances' vLLM workers are not pinned to cores: vLLM pins every worker to the same
    first core of the machine, so a second engine booted (at nice 10) on the core where the
    first serves and busy-polls, and took 90 s instead of 14 to start, with the other core
    idle."""
    assert default_model_dir.is_dir()
    root = tmp_path_factory.mktemp("llm-up")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PODIUM_CACHE", str(ModelCache().root))
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        mp.setenv("PODIUM_COLD_START_WAIT_S", str(COLD_START_WAIT_S))
        u = Up(root)
        try:
            u.start()
            packages = root / "packages"
            assert podium("announce", str(scaled_llm(packages)), "--api", u.api) == 0
            assert podium("announce", str(with_lora(write_llm(packages, "2"))),
                          "--api", u.api) == 0
            assert podium("deploy", f"{DEFAULT_MODEL}@1", "--stages", "100",
                          "--analysis-window", "0", "--warm-delay", "0",
                          "--ready-timeout", str(BOOT_TIMEOUT_S), "--api", u.api) == 0
            wait(lambda: u.rollout(1)["status"] != "running", what="v1 deployed",
                 timeout_s=BOOT_TIMEOUT_S + 30, interval_s=BOOT_POLL_S)
            assert u.rollout(1)["status"] == "succeeded", u.rollout(1)
            wait(lambda: len(instances(u, "1")) == 1, what="v1 ready")
            # the first instance too forks from the zygote, started with the deployment
            started = [m for m in events(u, "instance") if "zygote" in m]
            assert any("forked from the zygote" in m for m in started), started
            yield u
        finally:
            _stop(u)


def _stop(up: Up) -> None:
    pids: list[int] = []
    with contextlib.suppress(httpx.HTTPError, ValueError, AssertionError):
        pids = [i["pid"] for v in ("1", "2") for i in instances(up, v, state=None) if i["pid"]]
    if up.process is not None and up.process.poll() is None:
        up.process.terminate()
        up.process.wait(timeout=120)
    for pid in pids:  # a failed run must not leave an engine behind: its whole session
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def num_desired(up: Up) -> int:
    return up.status()["models"][DEFAULT_MODEL]["versions"]["1"]["num_desired"]


def events(up: Up, kind: str) -> list[str]:
    listed = up.get(f"/v1/events?model={DEFAULT_MODEL}&limit=100")
    assert isinstance(listed, list)
    return [e["message"] for e in reversed(listed) if e["kind"] == kind]


def _parent_command(pid: int) -> str:
    parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    return Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _ready(url: str) -> int:
    try:
        return httpx.get(url + "/health/ready", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_an_llm_scales_to_two_on_waiting_requests_and_back_to_one(up: Up) -> None:
    assert podium("scale", f"{DEFAULT_MODEL}@1", "--min", "1", "--max", "2",
                  "--api", up.api) == 0
    assert num_desired(up) == 1

    load = PostLoad(up.gateway, {**REQUEST, "max_tokens": 32}, num_clients=6, pause_s=0,
                    timeout_s=300, timeouts_fail=False)
    load.start()
    try:
        wait(lambda: num_desired(up) == 2, what="the autoscaler asking for a second instance",
             timeout_s=120)
    finally:
        calls = load.stop()
    [up_event] = [m for m in events(up, "scale") if "autoscale" in m]
    assert up_event.startswith(f"{DEFAULT_MODEL}@1 -> 2 (autoscale: waiting "), up_event
    assert calls and {c.status for c in calls} == {200}, (calls, load.num_timeouts)

    wait(lambda: len(instances(up, "1")) == 2, what="the second instance ready",
         timeout_s=BOOT_TIMEOUT_S, interval_s=BOOT_POLL_S)
    # forked from the runtime's zygote; its /metrics feeds the scale-down below (it once
    # answered 500 there: docs/operations.md, "Cold start: the zygote")
    assert any("podium.preload.zygote" in _parent_command(i["pid"]) for i in instances(up, "1"))
    # idle now: after the cooldown (counted from the moment both serve) one instance goes
    wait(lambda: num_desired(up) == 1, what="the scale-down after the cooldown",
         timeout_s=COOLDOWN_MS / 1000 + 60)
    wait(lambda: len(instances(up, "1", state=None)) == 1, what="one instance drained, stopped",
         timeout_s=90)
    assert events(up, "scale")[-1] == (f"{DEFAULT_MODEL}@1 -> 1 (autoscale: in_flight "
                                       "0/instance < target 64, waiting 0/instance < target 1)")
    r = httpx.post(up.gateway + "/v1/chat/completions", json=REQUEST, timeout=120)
    assert r.status_code == 200, r.text
    # the next scenarios load it without asking for a second instance
    assert podium("scale", f"{DEFAULT_MODEL}@1", "--min", "1", "--max", "1",
                  "--api", up.api) == 0


def test_an_idle_llm_scales_to_zero_and_a_held_request_starts_it(up: Up) -> None:
    """v1 opened to zero goes to zero once idle for its cooldown; a burst of BURST requests at
    once, then a trickle, at zero are held by the gateway (`PODIUM_COLD_START_WAIT_S=3` here)
    while the control plane starts an instance: those held longer than the bound get 503 with
    Retry-After, those that arrive within it of the instance's readiness are served; none is
    dropped. The start from zero is this module's one extra engine start, forked from the
    runtime's zygote."""
    wait(lambda: len(instances(up, "1")) == 1, what="one v1 instance", timeout_s=BOOT_TIMEOUT_S,
         interval_s=BOOT_POLL_S)
    [before] = instances(up, "1")
    assert podium("scale", f"{DEFAULT_MODEL}@1", "--min", "0", "--max", "1",
                  "--api", up.api) == 0
    wait(lambda: num_desired(up) == 0, what="v1 scaled to zero once idle",
         timeout_s=COOLDOWN_MS / 1000 + 60)
    wait(lambda: instances(up, "1", state=None) == [] or all(
        i["state"] == "stopped" for i in instances(up, "1", state=None)),
         what="v1's instance stopped", timeout_s=90)
    wait(lambda: not alive(before["pid"]), what="its process gone", timeout_s=30)
    assert cold_start_waits(up.gateway) == 0

    stop = threading.Event()
    sent: list[Sent] = []
    burst_sent: list[Sent] = []
    burster = threading.Thread(target=lambda: burst_sent.extend(burst(up.gateway, REQUEST,
                                                                      BURST)))
    sender = threading.Thread(target=lambda: sent.extend(trickle(up.gateway, REQUEST, stop)))
    burster.start()
    sender.start()
    try:
        wait(lambda: len(instances(up, "1")) == 1, what="v1 started from zero",
             timeout_s=BOOT_TIMEOUT_S, interval_s=BOOT_POLL_S)
        wait(lambda: cold_start_waits(up.gateway) >= 1, what="a held request served",
             timeout_s=30)
        time.sleep(2)
    finally:
        stop.set()
        sender.join(320)
        burster.join(320)
    # back to one at least before the cooldown could take the idle instance to zero again
    assert podium("scale", f"{DEFAULT_MODEL}@1", "--min", "1", "--max", "1",
                  "--api", up.api) == 0
    burst_why = [(s.status, s.retry_after, round(s.answered - s.started, 1), s.body[:80])
                 for s in burst_sent]
    assert len(burst_sent) == BURST, burst_why
    assert all(s.status == 200 or (s.status == 503 and s.retry_after and
                                   "starting from zero instances" in s.body)
               for s in burst_sent), burst_why  # served or refused cleanly, never dropped
    assert all(s.answered - s.started < COLD_START_WAIT_S + BOUND_SLACK_S
               for s in burst_sent if s.status == 503), burst_why  # refused at the bound
    [after] = instances(up, "1")
    assert after["pid"] != before["pid"]
    assert any("-> 1 (autoscale" in m for m in events(up, "scale")[-3:]), events(up, "scale")
    why = [(round(s.started - sent[0].started, 1), s.status, s.retry_after, s.body[:80])
           for s in sent]
    assert all(s.status == 200 or (s.status == 503 and s.retry_after) for s in sent), why
    refused = [s for s in sent if s.status == 503]
    assert refused and all("starting from zero instances" in s.body for s in refused), why
    assert sent[-1].status == 200, why
    print(f"from zero: a burst of {BURST}: "
          f"{sum(s.status == 200 for s in burst_sent)} served, "
          f"{sum(s.status == 503 for s in burst_sent)} refused at the bound; trickle: "
          f"{len(sent)} requests, {len(refused)} refused after the bound; held and served: "
          f"{cold_start_waits(up.gateway):g}")


def test_engine_killed_under_load_fails_in_flight_requests_clearly_and_is_restarted(
        up: Up) -> None:
    """The engine core (vLLM's `EngineCore` child process) is killed with `kill -9` while
    clients call the gateway. The instance reports not-ready at once and exits 1 saying its
    engine died, and the control plane restarts it; requests in flight fail with a clear 5xx
    naming the dead engine, the ones sent while no instance is ready get a fast 503 saying so,
    nothing hangs, and requests succeed again once the restarted instance is ready.

    One instance, not two: two vLLM engines booting side by side on this 2-core machine took
    325 s to be ready (and the restart as long again). Routing around a dead instance to a live
    one is the gateway's own path, tested without an engine."""
    wait(lambda: len(instances(up, "1", state=None)) == 1, what="one v1 instance")
    [victim] = instances(up, "1")
    victim_url = f"http://127.0.0.1:{victim['http_port']}"
    core = engine_core(victim["pid"])

    load = PostLoad(up.gateway, REQUEST)
    load.start()
    wait(lambda: len(load.calls) >= 4, what="calls before the kill", timeout_s=180)
    # the clients run in step: kill while a batch is in the engine, not between two
    wait(lambda: load.num_in_flight == load.num_clients, what="requests in flight")
    time.sleep(0.3)  # into the engine's step: the requests were sent, not yet answered
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
    # the instance exited 1 on its dead engine (a supervisor restarts it), saying why
    exits = [m for m in events(up, "instance") if "exited with status" in m]
    assert any(m.endswith(": exited with status 1") for m in exits), exits
    assert any("died" in log.read_text(errors="replace")
               for log in up.home.rglob("logs/*.log")), "no instance log says its engine died"
    failed = [c for c in calls if c.status != 200]
    assert failed, "the kill must have cost the requests in flight"
    for call in failed:  # none hangs, each says why
        assert call.status in (502, 503), call
        assert call.ended - max(call.started, killed_at) < 30, call
    in_flight = [c for c in failed if c.started < killed_at]
    assert in_flight and all("engine" in c.error or "failed mid-request" in c.error
                             for c in in_flight), in_flight
    # out of routing within a pass: refused by the gateway at once, naming the model
    refused = [c for c in failed if c.started > killed_at + OUT_OF_ROUTING_S]
    assert all("no ready instance" in c.error or "no version taking traffic" in c.error
               for c in refused), refused
    assert all(c.ended - c.started < 5 for c in refused), refused
    assert all(c.status == 200 for c in calls if c.started > restarted_at)
    print(f"not ready after {not_ready_s:.2f} s; {len(failed)} failed of {len(calls)}: "
          f"{sorted({(c.status, c.error[:100]) for c in failed})}")


def test_red_black_rollout_of_the_llm_under_openai_clients_drops_no_request(up: Up) -> None:
    wait(lambda: len(instances(up, "1")) == 1, what="v1 ready", timeout_s=BOOT_TIMEOUT_S,
         interval_s=BOOT_POLL_S)
    [v1] = instances(up, "1")
    start = gateway_counts(up.gateway)  # the earlier scenarios' requests (and failures)

    def counts() -> dict[tuple[str, str], int]:
        now = gateway_counts(up.gateway)
        return {key: now[key] - start[key] for key in {*now, *start}}

    load = ChatLoad(up.gateway + "/v1")
    load.start()
    load.wait_calls(8)
    before = counts()
    assert before.get(("1", "ok"), 0) >= 8 and before.get(("2", "ok"), 0) == 0

    # 4 clients and two engines share 2 cores: latency is judged loosely (the fake-clock tests
    # pin the latency rule); what this run checks is that no request is dropped
    deployed = httpx.post(up.api + "/v1/rollouts", timeout=30, json={
        "model": DEFAULT_MODEL, "version": "2", "stages": [50, 100], "num_instances": 1,
        "ready_timeout_ms": BOOT_TIMEOUT_S * 1000, **LLM_ROLLOUT_JUDGING,
        "max_p99_ratio": 10.0, "p99_slack_ms": 5_000.0, "warm_delay_ms": 3_000})
    assert deployed.status_code == 201, deployed.text
    rollout_id = deployed.json()["id"]

    # the 50% stage: both versions serve, by split and explicitly as model@version
    wait(lambda: up.rollout(rollout_id)["weight_new"] == 50
         or up.rollout(rollout_id)["status"] != "running",
         what="the 50% stage", timeout_s=BOOT_TIMEOUT_S + 30, interval_s=BOOT_POLL_S)
    assert up.rollout(rollout_id)["status"] == "running", up.rollout(rollout_id)
    at_50 = counts()
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
    at_100 = counts()

    wait(lambda: up.rollout(rollout_id)["status"] != "running", what="the rollout",
         timeout_s=120)
    record = up.rollout(rollout_id)
    assert record["status"] == "succeeded", record
    wait(lambda: instances(up, "1", state=None) == []
         or all(i["state"] == "stopped" for i in instances(up, "1", state=None)),
         what="v1 drained and stopped", timeout_s=90)
    wait(lambda: not alive(v1["pid"]), what="v1's process gone", timeout_s=30)
    after_rollout = counts()
    load.wait_calls(len(load.calls) + 8)
    calls = load.stop()
    end = counts()

    assert [c for c in calls if c.error] == []
    assert len(calls) >= 24
    assert {c.model for c in calls} == {DEFAULT_MODEL}  # the gateway answers as `name`
    # over the 50% stage the split sent the clients' requests to both versions (beyond the
    # one explicit model@version call each)
    for version in ("1", "2"):
        assert at_100.get((version, "ok"), 0) - at_50.get((version, "ok"), 0) >= 3, \
            (at_50, at_100)
    # nothing failed at the gateway; once the rollout was done every request went to v2
    assert end.get(("1", "error"), 0) == end.get(("2", "error"), 0) == 0, end
    assert end.get(("1", "ok"), 0) == after_rollout.get(("1", "ok"), 0)
    assert end.get(("2", "ok"), 0) >= after_rollout.get(("2", "ok"), 0) + 4
    assert len(instances(up, "2")) == 1
    assert up.status()["models"][DEFAULT_MODEL]["splits"] == {"2": 100}


ADAPTER = "tone"
ADAPTER_ROLLOUT = {"stages": [50, 100], "analysis_window_ms": 4_000, "min_requests": 5,
                   "evidence_wait_ms": 240_000, "max_p99_ratio": 10.0,
                   "p99_slack_ms": 5_000.0, "warm_delay_ms": 2_000}
"""Each stage is judged on at least 5 answered requests of the new version: an adapter's
answer took 8-35 s on a loaded 2-core machine, longer than the window, so without the wait
every stage passed unjudged (the first run of this test, 2026-12-03). With that evidence the
window need not be long: 4 s (8 s until 2026-12-04; ~10 requests a version a stage came in
it), three stages judged, ~12 s less."""


def test_adapter_rollouts_move_the_split_on_the_base_and_roll_a_broken_version_back(
        up: Up, tmp_path: Path) -> None:
    """LoRA adapters of v2 announced (nothing starts) and deployed onto v2's instance; a
    Red-Black rollout tone@1 -> tone@2 under OpenAI clients moves the split (50%, then 100%)
    with no failed request; tone@3, whose weights fail to load, is rolled back by the
    analysis at its first stage. (Run alone, it first rolls v2 out itself.)"""
    if up.status()["models"][DEFAULT_MODEL]["splits"] != {"2": 100}:
        own = rollout(up.api, DEFAULT_MODEL, "2", stages=[100], analysis_window_ms=0,
                      warm_delay_ms=0, ready_timeout_ms=BOOT_TIMEOUT_S * 1000)
        wait(lambda: up.rollout(own)["status"] != "running", what="v2 rolled out",
             timeout_s=BOOT_TIMEOUT_S, interval_s=BOOT_POLL_S)
    # v1 (no LoRA) must be gone: an adapter is placed on every running version of its base
    wait(lambda: instances(up, "1", state=None) == []
         or all(i["state"] == "stopped" for i in instances(up, "1", state=None)),
         what="v1 stopped", timeout_s=90)
    wait(lambda: len(instances(up, "2")) == 1, what="v2 ready", timeout_s=BOOT_TIMEOUT_S,
         interval_s=BOOT_POLL_S)
    [base] = instances(up, "2")
    base_key = f"{DEFAULT_MODEL}@2"
    for version, seed in (("1", 3001), ("2", 3002), ("3", 93003)):
        package = adapter_package(tmp_path, ADAPTER, version, base_key, seed)
        assert podium("announce", str(package), "--api", up.api) == 0
    assert ADAPTER not in up.status()["models"]  # announcing starts nothing
    first = rollout(up.api, ADAPTER, "1", stages=[100], analysis_window_ms=0, warm_delay_ms=0)
    wait(lambda: up.rollout(first)["status"] != "running", what="tone@1 placed", timeout_s=60)
    assert up.rollout(first)["status"] == "succeeded", up.rollout(first)
    status = up.status()
    assert status["models"][ADAPTER]["base"] == DEFAULT_MODEL
    assert status["models"][DEFAULT_MODEL]["adapters"] == [ADAPTER]
    assert instances(up, "2") == [base]  # no instance, no boot: the same process serves it

    load = ChatLoad(up.gateway + "/v1", model=ADAPTER, pause_s=0.5)
    load.start()
    broken: Path | None = None
    try:
        load.wait_calls(8)
        start = gateway_counts(up.gateway, ADAPTER)  # tone@1 alone so far
        second = rollout(up.api, ADAPTER, "2", **ADAPTER_ROLLOUT)
        weights = []
        while up.rollout(second)["status"] == "running":
            weights.append(up.rollout(second)["weight_new"])
            time.sleep(0.2)
        assert up.rollout(second)["status"] == "succeeded", up.rollout(second)
        assert 50 in weights, weights  # the split was seen at its first stage
        done = time.monotonic()
        during = gateway_counts(up.gateway, ADAPTER)
        load.wait_calls(len(load.calls) + 8)
        after = gateway_counts(up.gateway, ADAPTER)
        steps = [s["note"] for s in up.get(f"/v1/rollouts/{second}")["steps"]]
        why = (start, during, after, weights, steps)
        assert [c for c in load.calls if c.error] == []  # 0 failed requests
        assert during[("1", "ok")] - start[("1", "ok")] >= 3, why  # both versions served
        assert during[("2", "ok")] - start[("2", "ok")] >= 3, why  # judged on evidence
        later = [c.model for c in load.calls if c.started > done]
        assert later and set(later) == {f"{ADAPTER}@2"}, (later, why)  # then only tone@2
        assert after[("2", "error")] == after[("1", "error")] == 0, after

        broken = break_stored_adapter(base_key, ADAPTER, "3")
        third = rollout(up.api, ADAPTER, "3", **ADAPTER_ROLLOUT)
        wait(lambda: up.rollout(third)["status"] != "running", what="tone@3 judged",
             timeout_s=120)
        record = up.rollout(third)
        assert record["status"] == "rolled_back", record
        assert "analysis failed at 50%: error rate" in record["reason"], record
        # as a model's rollback leaves it: the broken version at 0%, all traffic on tone@2
        assert up.status()["models"][ADAPTER]["splits"] == {"2": 100, "3": 0}
        count = len(load.calls)
        load.wait_calls(count + 8)
        assert [c for c in load.calls[count + 4:] if c.error] == []  # tone@2 serves on
    finally:
        load.stop()
        if broken is not None:
            forget_stored_adapter(broken)
    assert instances(up, "2") == [base]
