"""Clients that keep the real LLM busy behind a `podium up` gateway, and what the gateway and
the instances say about it (tests/control/test_e2e_llm.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import openai
import psutil

from podium.package.defaults import DEFAULT_MODEL
from tests.support.up_process import wait


def gateway_counts(gateway: str, model: str = DEFAULT_MODEL) -> Counter[tuple[str, str]]:
    """(version, outcome) -> requests of `model` (default: the default LLM), from the
    gateway's own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(gateway + "/metrics", timeout=10).text
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):  # read as Prometheus reads it
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "podium:gateway_requests_total" and \
                    labels.get("model") == model:
                counts[(labels["version"], labels["outcome"])] += int(sample.value)
    return counts


def engine_core(pid: int) -> psutil.Process:
    """The vLLM engine core process under the instance `pid`: titled `VLLM::EngineCore` when
    vLLM spawned it, or (forked from Podium's preloader, whose name it keeps) the parent of the
    engine's worker, which vLLM always spawns and titles `VLLM::Worker`."""
    for child in [*psutil.Process(pid).children(recursive=True), *_engine_of(pid)]:
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
            if child.name().startswith("VLLM::Worker") and child.parent() is not None:
                return child.parent()
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no EngineCore process under instance pid {pid}")


def _engine_of(pid: int) -> list[psutil.Process]:
    """The processes of the instance `pid`'s engine wherever they are in the process tree: a
    server forked from `podium up`'s zygote has its preloader, and so its engine core, under
    the zygote, titled after the server (`podium.preload.zygote.PRELOADER_TITLE`)."""
    title = f"podium engine preloader of server {pid}"
    for process in psutil.process_iter():
        try:
            if title in " ".join(process.cmdline()):
                return process.children(recursive=True)
        except psutil.Error:
            continue
    return []


@dataclass
class Call:
    started: float
    ended: float
    model: str = ""
    status: int = 0
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
    model: str = DEFAULT_MODEL
    """What the clients ask for (a LoRA adapter's name, for one)."""
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
                    model=self.model, max_tokens=8, temperature=0,
                    messages=[{"role": "user", "content": f"Say hello to client {n}."}])
                tokens = answer.usage.completion_tokens if answer.usage else 0
                error = "" if answer.choices and tokens > 0 else f"empty answer: {answer}"
                self.calls.append(Call(started, time.monotonic(), answer.model, error=error))
            except openai.OpenAIError as exc:
                self.calls.append(Call(started, time.monotonic(), error=repr(exc)))
            self._stop.wait(self.pause_s)


@dataclass
class PostLoad:
    """`num_clients` threads posting `request` to the gateway's chat completions back to back
    (`pause_s` apart). With `timeouts_fail` off, a request that times out is counted in
    `num_timeouts`, not recorded as a call: queued behind others on 2 shared cores, slow is
    not wrong (a refused or failed request is)."""

    url: str
    request: dict
    num_clients: int = 4
    pause_s: float = 0.2
    timeout_s: float = 120
    timeouts_fail: bool = True
    calls: list[Call] = field(default_factory=list)
    num_in_flight: int = 0
    num_timeouts: int = 0
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
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                with self._lock:
                    self.num_in_flight += 1
                try:
                    r = client.post(self.url + "/v1/chat/completions", json=self.request)
                    self.calls.append(Call(started, time.monotonic(), status=r.status_code,
                                           error="" if r.status_code == 200 else r.text[:300]))
                except httpx.TimeoutException as exc:
                    if self.timeouts_fail:
                        self.calls.append(Call(started, time.monotonic(), error=repr(exc)))
                    else:
                        self.num_timeouts += 1
                except httpx.HTTPError as exc:
                    self.calls.append(Call(started, time.monotonic(), error=repr(exc)))
                finally:
                    with self._lock:
                        self.num_in_flight -= 1
                self._stop.wait(self.pause_s)
