"""The admission probe's cached measurement (`probe_cache`) and the sizing built on it
(`sizing`): a hit sizes the bounds without running the probe and says when it was measured;
a miss, a record for other factors (another machine, other threads), a stale or corrupted
record all measure at boot, and none fails it; after ready, the re-measurement yields to
traffic. On fake engines; the real engine's bounds: tests/frontends/test_admission_real.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from podium.backends.limits import InstanceLimits
from podium.backends.vllm import probe, probe_cache, sizing
from tests.support.admission_rates import RATES
from tests.support.timed_engine import TimedEngine

MACHINE = {"hardware": {"cpu": "test cpu"}, "cpus": 2, "env": {}}
THREADS = SimpleNamespace(threads=2, bind="0,1")


def _engine() -> TimedEngine:
    engine = TimedEngine()
    model = SimpleNamespace(dtype="torch.bfloat16", max_model_len=2048, quantization=None)
    sched = SimpleNamespace(max_num_seqs=256, max_num_batched_tokens=2048,
                            enable_chunked_prefill=True, max_num_queued_reqs=256,
                            max_num_queued_tokens=65536)
    engine.vllm_config = SimpleNamespace(model_config=model, scheduler_config=sched,
                                         compilation_config=SimpleNamespace(mode=0))
    engine.scheduler_config = sched
    engine.input_processor = SimpleNamespace(process_inputs=None, process_inputs_async=None)
    return engine


def _backend(engine: Any) -> Any:
    backend = SimpleNamespace(
        engine=engine, task="generate", package=SimpleNamespace(key="llm@1"),
        limits=InstanceLimits(), manifest=SimpleNamespace(),
        args=SimpleNamespace(model="/cache/objects/abc123", max_num_queued_reqs=256,
                             max_num_queued_tokens=65536), admission=None)
    backend.admission_rates = lambda: backend.admission.rates if backend.admission else None
    return backend


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PODIUM_CACHE", str(tmp_path))
    monkeypatch.setattr(probe_cache, "machine_factors", lambda: dict(MACHINE))
    return tmp_path


def test_a_stored_measurement_is_read_back_for_the_same_factors_only(cache: Path) -> None:
    factors = probe_cache.key_factors("abc123", _engine(), THREADS, MACHINE)
    assert probe_cache.lookup(cache, factors) is None  # nothing measured yet
    probe_cache.store(cache, factors, RATES, now=1000.0)
    hit = probe_cache.lookup(cache, factors, now=1060.0)
    assert hit is not None and hit.rates == RATES and hit.measured_at == 1000.0
    other_machine = probe_cache.key_factors("abc123", _engine(), THREADS,
                                            {**MACHINE, "cpus": 16})
    other_threads = probe_cache.key_factors("abc123", _engine(),
                                            SimpleNamespace(threads=1, bind="0"), MACHINE)
    for other in (other_machine, other_threads):
        assert probe_cache.lookup(cache, other, now=1060.0) is None


def test_a_stale_a_foreign_or_a_corrupted_record_is_a_miss(cache: Path) -> None:
    factors = probe_cache.key_factors("abc123", _engine(), THREADS, MACHINE)
    probe_cache.store(cache, factors, RATES, now=1000.0)
    assert probe_cache.lookup(cache, factors, now=1000.0 + probe_cache.MAX_AGE_S + 1) is None
    path = probe_cache.path_for(cache, factors)
    record = json.loads(path.read_text())
    record["factors"]["machine"]["cpus"] = 64  # copied from another machine under this name
    path.write_text(json.dumps(record))
    assert probe_cache.lookup(cache, factors, now=1001.0) is None
    for garbage in ("{not json", json.dumps({"factors": factors}),
                    json.dumps({**record, "factors": factors,
                                "rates": {**record["rates"], "prefill_tokens_per_s": -1}})):
        path.write_text(garbage)
        assert probe_cache.lookup(cache, factors, now=1001.0) is None
    probe_cache.store(cache, factors, RATES, now=1000.0)  # then a good one reads back
    assert probe_cache.lookup(cache, factors, now=1001.0) is not None


async def test_the_first_boot_measures_and_the_next_reads_the_cache() -> None:
    first = _backend(_engine())
    await sizing.Sizing(first, THREADS).size_at_boot()
    assert first.admission.measured_at is None and first.admission.sources == {
        "max_num_queued_reqs": "measured", "max_num_queued_tokens": "measured"}
    assert first.engine.prompts  # the probe ran
    assert "probe took" in first.admission.describe("llm@1")

    second = _backend(_engine())
    sized = sizing.Sizing(second, THREADS)
    await sized.size_at_boot()
    assert second.engine.prompts == []  # no probe at boot
    assert second.admission.rates == first.admission.rates
    assert second.admission.measured_at is not None and sized.task is None  # fresh: kept
    line = second.admission.describe("llm@1")
    assert "measured at" in line and "on this machine" in line
    assert second.engine.scheduler_config.max_num_queued_reqs == \
        first.admission.max_num_queued_reqs
    assert second.admission.as_dict()["measured_at"].endswith("UTC")


async def test_a_corrupted_cache_or_a_failing_probe_never_fails_the_boot(cache: Path) -> None:
    backend = _backend(_engine())
    await sizing.Sizing(backend, THREADS).size_at_boot()
    for path in (cache / "probe").iterdir():
        path.write_text("\0garbage")
    again = _backend(_engine())
    await sizing.Sizing(again, THREADS).size_at_boot()
    assert again.engine.prompts and again.admission.measured_at is None  # measured again

    class Broken(TimedEngine):
        async def generate(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("engine hiccup")
            yield

    broken = _backend(_engine())
    broken.engine.generate = Broken().generate
    (cache / "probe").rename(cache / "probe-old")  # a miss: the probe must run, and fails
    await sizing.Sizing(broken, THREADS).size_at_boot()
    assert set(broken.admission.sources.values()) == {"default"}


async def test_an_old_measurement_is_refreshed_after_ready_when_the_engine_is_idle(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "IDLE_S", 0.05)
    monkeypatch.setenv("PODIUM_ADMISSION_REFRESH", "1")  # the suite turns it off
    factors = probe_cache.key_factors("abc123", _engine(), THREADS, MACHINE)
    old = time.time() - sizing.REFRESH_AGE_S - 60
    slow = SimpleNamespace(**{**vars(RATES), "prefill_tokens_per_s": 1.0})
    probe_cache.store(cache, factors, probe_cache.Rates(**vars(slow)), now=old)
    backend = _backend(_engine())
    sized = sizing.Sizing(backend, THREADS)
    await sized.size_at_boot()
    assert backend.admission.rates.prefill_tokens_per_s == 1.0 and sized.task is not None
    await asyncio.wait_for(sized.task, 10)
    assert backend.admission.measured_at is None  # measured now, in force
    assert backend.admission.rates.prefill_tokens_per_s > 1.0
    assert backend.admission_rates() is backend.admission.rates  # what deadlines read
    cached = probe_cache.lookup(cache, factors)
    assert cached is not None and cached.rates == backend.admission.rates


async def test_the_remeasurement_yields_to_a_request_and_aborts_its_own() -> None:
    engine = _engine()
    engine.step_s = 0.05
    probing = asyncio.ensure_future(probe.measure_undisturbed(engine, "generate"))
    while not any(k.startswith(probe.PREFIX) for k in engine.output_processor.request_states):
        await asyncio.sleep(0.001)
    engine.output_processor.request_states["chatcmpl-1-0001"] = object()  # traffic
    with pytest.raises(probe.Disturbed):
        await asyncio.wait_for(probing, 10)
    assert list(engine.output_processor.request_states) == ["chatcmpl-1-0001"]  # aborted
    with pytest.raises(probe.Disturbed):  # still serving: it does not start
        await probe.measure_undisturbed(engine, "generate")
    del engine.output_processor.request_states["chatcmpl-1-0001"]
    rates = await probe.measure_undisturbed(engine, "generate")  # quiet: it measures
    assert rates.decode_tokens_per_s


async def test_the_refresh_can_be_turned_off(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODIUM_ADMISSION_REFRESH", "0")
    factors = probe_cache.key_factors("abc123", _engine(), THREADS, MACHINE)
    probe_cache.store(cache, factors, RATES, now=time.time() - sizing.REFRESH_AGE_S - 60)
    backend = _backend(_engine())
    sized = sizing.Sizing(backend, THREADS)
    await sized.size_at_boot()
    assert backend.admission.measured_at is not None and sized.task is None
    assert backend.engine.prompts == []
