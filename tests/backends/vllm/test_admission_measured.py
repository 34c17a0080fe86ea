"""Admission bounds from the engine's measured speed (`backends.vllm.admission`, `probe`) and
the deadline check built on the same rates (`deadline_check`), on fake engines: which bound
wins, what the probe measures, and a request that cannot finish in time refused before the
engine counts it. The real engine's derived bounds: tests/frontends/test_admission_real.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from podium.backends import deadline
from podium.backends.limits import InstanceLimits
from podium.backends.vllm import admission, deadline_check, probe
from podium.errors import Overloaded
from tests.support.admission_rates import RATES
from tests.support.timed_engine import TimedEngine


def test_the_bounds_are_the_work_the_engine_finishes_in_the_target_wait() -> None:
    reqs, tokens = admission.derive(RATES, 30)
    assert tokens == 30_000  # 30 s of prefill
    # one reference request: 128/1000 s of prefill + 64/80 s of the batch's decode
    assert reqs == int(30 / (0.128 + 0.8))
    assert admission.derive(RATES, 60)[0] >= 2 * reqs - 1  # twice the wait, twice the work


@pytest.mark.parametrize(("limits", "manifest", "sources"), [
    pytest.param(InstanceLimits(), {}, ("measured", "measured"), id="measured"),
    pytest.param(InstanceLimits(max_num_queued_tokens=1500), {}, ("measured", "flag"),
                 id="flag"),
    pytest.param(InstanceLimits(max_num_queued_reqs=9), {"max_num_queued_reqs": 4,
                                                          "max_num_queued_tokens": 77},
                 ("flag", "package"), id="flag-over-package"),
])
def test_a_flag_or_the_package_overrides_the_measured_bound(limits: InstanceLimits,
                                                            manifest: dict[str, Any],
                                                            sources: tuple[str, str]) -> None:
    bounds = admission.bounds_in_force(limits, SimpleNamespace(**manifest), RATES, 1.2)
    assert (bounds.sources["max_num_queued_reqs"],
            bounds.sources["max_num_queued_tokens"]) == sources
    measured = admission.derive(RATES, limits.admission_target_wait_s)
    expected = {"flag": (limits.max_num_queued_reqs, limits.max_num_queued_tokens),
                "package": (manifest.get("max_num_queued_reqs"),
                            manifest.get("max_num_queued_tokens")), "measured": measured}
    assert bounds.max_num_queued_reqs == expected[sources[0]][0]
    assert bounds.max_num_queued_tokens == expected[sources[1]][1]
    line = bounds.describe("llm@1")
    assert "30s target wait" in line and "prefill 1000 tokens/s" in line and "probe took" in line
    assert bounds.as_dict()["rates"]["decode_tokens_per_s"] == 80.0


def test_without_a_measurement_the_fixed_defaults_stay() -> None:
    bounds = admission.bounds_in_force(InstanceLimits(), SimpleNamespace(), None)
    assert (bounds.max_num_queued_reqs, bounds.max_num_queued_tokens) == (256, 65536)
    assert set(bounds.sources.values()) == {"default"} and "not measured" in bounds.describe("m")


def test_the_bounds_are_put_on_the_engines_scheduler_config() -> None:
    engine = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_queued_reqs=256,
                                                              max_num_queued_tokens=65536))
    args = SimpleNamespace(max_num_queued_reqs=256, max_num_queued_tokens=65536)
    bounds = admission.bounds_in_force(InstanceLimits(admission_target_wait_s=10),
                                       SimpleNamespace(), RATES)
    admission.apply(engine, args, bounds)
    assert engine.scheduler_config.max_num_queued_tokens == args.max_num_queued_tokens == 10_000
    assert engine.scheduler_config.max_num_queued_reqs == bounds.max_num_queued_reqs


async def test_the_probe_measures_prefill_and_the_batchs_decode() -> None:
    engine = TimedEngine()
    rates = await probe.measure(engine, "generate")
    assert rates.prefill_tokens == probe.PREFILL_TOKENS and rates.batch == probe.BATCH
    assert 0 < rates.prefill_tokens_per_s <= 10_000  # 1e-4 s a token at best
    assert rates.decode_tokens_per_s is not None
    assert 0 < rates.decode_tokens_per_s <= probe.BATCH / engine.step_s * 1.05
    # no two probe prompts share a prefix the engine could have cached
    assert len({tuple(p[:4]) for p in engine.prompts}) == len(engine.prompts)


async def test_the_probe_of_an_embedding_model_measures_prefill_only() -> None:
    rates = await probe.measure(TimedEngine(), "embed")
    assert rates.decode_tokens_per_s is None and rates.prefill_tokens_per_s > 0
    assert rates.step_s == 0.0


class Processor:
    """vLLM's input processor: a prompt in, an EngineCoreRequest out."""

    def process_inputs(self, request_id: str, prompt: list[int], params: Any) -> Any:
        return SimpleNamespace(prompt_token_ids=prompt, sampling_params=params,
                               pooling_params=None)

    async def process_inputs_async(self, request_id: str, prompt: list[int], params: Any
                                   ) -> Any:
        return self.process_inputs(request_id, prompt, params)


def _engine(queued_tokens: int = 0) -> Any:
    engine = SimpleNamespace(input_processor=Processor(),
                             get_num_queued_tokens=lambda: queued_tokens)
    deadline_check.install(engine, lambda: RATES)
    return engine


LONG = SimpleNamespace(max_tokens=400, ignore_eos=True, min_tokens=0)
"""400 tokens it must produce: 40 s at RATES' step of 0.1 s."""
SHORT = SimpleNamespace(max_tokens=400, ignore_eos=False, min_tokens=0)
"""It may stop at its first token."""


async def test_a_request_that_cannot_meet_its_deadline_is_refused_before_it_is_queued() -> None:
    engine = _engine()
    with deadline.scope(5.0):
        with pytest.raises(deadline_check.DeadlineRefused) as refused:
            await engine.input_processor.process_inputs_async("r1", [1] * 100, LONG)
        with pytest.raises(deadline_check.DeadlineRefused):
            engine.input_processor.process_inputs("r2", [1] * 100, LONG)
        # followed by a good request: one that may finish in time is admitted
        assert engine.input_processor.process_inputs("r3", [1] * 100, SHORT).prompt_token_ids
    overloaded = deadline_check.refusal(refused.value)
    assert isinstance(overloaded, Overloaded) and overloaded.param == "X-Request-Timeout"
    assert "cannot finish within its deadline" in overloaded.message
    again = deadline_check.refusal_message(refused.value.message)
    assert again is not None and again.retry_after_s == overloaded.retry_after_s


async def test_the_backlog_ahead_counts_and_without_a_deadline_nothing_is_checked() -> None:
    engine = _engine(queued_tokens=20_000)  # 20 s of prefill ahead
    with deadline.scope(10.0), pytest.raises(deadline_check.DeadlineRefused) as refused:
        engine.input_processor.process_inputs("r1", [1] * 10, SHORT)
    assert refused.value.retry_after_s == 20.0  # when the backlog ahead has been prefilled
    assert "20000 prompt tokens wait" in refused.value.message
    with deadline.scope(30.0):
        engine.input_processor.process_inputs("r2", [1] * 10, SHORT)
    engine.input_processor.process_inputs("r3", [1] * 10, LONG)  # no deadline: admitted


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "1e9", ""])
def test_a_bad_timeout_header_is_a_400_naming_it(value: str) -> None:
    from podium.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="X-Request-Timeout") as bad:
        deadline.parse(value)
    assert bad.value.param == "X-Request-Timeout"
    assert deadline.parse("2.5") == 2.5  # followed by a good one
