"""An LLM instance's admission bounds, derived from what its engine was measured to do.

vLLM's own admission control refuses a request past `max_num_queued_reqs` (requests waiting
and running) or `max_num_queued_tokens` (prompt tokens still waiting for prefill). A fixed
default (256 requests, 65,536 tokens) says nothing about the machine: on a 2-core CPU that is
minutes of work, so every admitted request of a burst answers long after its client gave up.
After the warm-up the backend measures the engine (`probe.measure`: its prefill rate and its
decode rate at a small batch, a second or two) and sets both bounds to the work the engine
finishes within the target wait (`--admission-target-wait-s`, 30 s by default):

- `max_num_queued_tokens` = prefill rate x target wait: a request admitted behind that
  backlog gets its first token within the target (vLLM's own sizing rule for this setting);
- `max_num_queued_reqs` = target wait / the time one reference request (128 prompt tokens,
  64 output tokens) costs the engine at the measured rates.

A bound set by the package's manifest or by `podium serve --max-num-queued-*` wins over the
measured one (`sources` says which is which). The bounds are set on the engine's scheduler
config, which vLLM reads on every admission check, so the refusal stays vLLM's own (a fast
429 / RESOURCE_EXHAUSTED with `Retry-After`, `checks.admission_refusal`).

The same rates estimate whether a request carrying a deadline (`backends.deadline`) can finish
in time: the prefill of the backlog ahead of it and of its own prompt, plus the tokens it must
produce (`min_tokens`, or `max_tokens` with `ignore_eos`) at the measured step time.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from podium.backends.limits import (
    DEFAULT_MAX_NUM_QUEUED_REQS,
    DEFAULT_MAX_NUM_QUEUED_TOKENS,
    InstanceLimits,
)

REFERENCE_PROMPT_TOKENS = 128
"""The prompt of the request `max_num_queued_reqs` is counted in."""
REFERENCE_OUTPUT_TOKENS = 64
"""Its output."""
MEASURED, PACKAGE, FLAG, DEFAULT = "measured", "package", "flag", "default"
"""Where a bound in force came from."""


@dataclass(frozen=True)
class Rates:
    """What the probe measured on this engine."""

    prefill_tokens_per_s: float
    """Prompt tokens prefilled per second (one prompt of `prefill_tokens`)."""
    prefill_tokens: int
    prefill_s: float
    """The probe's prefill part, in seconds."""
    decode_tokens_per_s: float | None
    """Output tokens per second over a batch of `batch` sequences; None: a pooling model."""
    batch: int
    decode_s: float
    """The probe's decode part, in seconds (0 for a pooling model)."""

    @property
    def step_s(self) -> float:
        """Seconds of one decode step (every running sequence gains a token)."""
        if not self.decode_tokens_per_s:
            return 0.0
        return self.batch / self.decode_tokens_per_s

    def seconds_for(self, prompt_tokens: float, output_tokens: float) -> float:
        """What a request of this shape costs the engine's throughput, in seconds."""
        decode = output_tokens / self.decode_tokens_per_s if self.decode_tokens_per_s else 0.0
        return prompt_tokens / self.prefill_tokens_per_s + decode


def derive(rates: Rates, target_wait_s: float) -> tuple[int, int]:
    """(max_num_queued_reqs, max_num_queued_tokens): the work `rates` finish in the wait."""
    tokens = max(1, int(rates.prefill_tokens_per_s * target_wait_s))
    per_request = rates.seconds_for(REFERENCE_PROMPT_TOKENS, REFERENCE_OUTPUT_TOKENS)
    return max(1, int(target_wait_s / per_request)), tokens


@dataclass(frozen=True)
class Bounds:
    """The admission bounds in force on one engine, where each came from, and why."""

    max_num_queued_reqs: int
    max_num_queued_tokens: int
    sources: dict[str, str]
    """Per bound: measured, package, flag or default (the probe failed)."""
    target_wait_s: float
    rates: Rates | None
    probe_s: float
    measured_at: float | None = None
    """When `rates` were measured (seconds since the epoch) if read back from the cache
    (`probe_cache`); None: measured during this boot."""

    def describe(self, key: str) -> str:
        """One log line: the bounds, their sources, the rates and how long measuring took."""
        bounds = (f"max_num_queued_reqs={self.max_num_queued_reqs} "
                  f"({self.sources['max_num_queued_reqs']}), max_num_queued_tokens="
                  f"{self.max_num_queued_tokens} ({self.sources['max_num_queued_tokens']})")
        if self.rates is None:
            return f"admission of {key}: {bounds}; not measured"
        r = self.rates
        decode = (f", decode {r.decode_tokens_per_s:.0f} output tokens/s at batch {r.batch} "
                  f"({r.decode_s:.2f}s)" if r.decode_tokens_per_s else "")
        when = (f"probe took {self.probe_s:.2f}s" if self.measured_at is None else
                f"measured at {_utc(self.measured_at)} on this machine (the probe's last run, "
                "read from the cache)")
        return (f"admission of {key}: {bounds} for a {self.target_wait_s:g}s target wait; "
                f"measured prefill {r.prefill_tokens_per_s:.0f} tokens/s ({r.prefill_tokens} "
                f"tokens, {r.prefill_s:.2f}s){decode}; {when}")

    def as_dict(self) -> dict[str, Any]:
        """What the model's config route shows (`/v2/models/{m}/config`, `admission`)."""
        return {"max_num_queued_reqs": self.max_num_queued_reqs,
                "max_num_queued_tokens": self.max_num_queued_tokens,
                "sources": dict(self.sources), "target_wait_s": self.target_wait_s,
                "rates": asdict(self.rates) if self.rates else None,
                "probe_s": round(self.probe_s, 3),
                "measured_at": None if self.measured_at is None else _utc(self.measured_at)}


def bounds_in_force(limits: InstanceLimits, manifest: Any, rates: Rates | None,
                    probe_s: float = 0.0, measured_at: float | None = None) -> Bounds:
    """Per bound: the flag's, else the package's, else the measured one (else the fixed
    default, when there is no measurement)."""
    target = limits.admission_target_wait_s
    measured = derive(rates, target) if rates is not None else None
    values: dict[str, int] = {}
    sources: dict[str, str] = {}
    for i, (name, default) in enumerate((("max_num_queued_reqs", DEFAULT_MAX_NUM_QUEUED_REQS),
                                         ("max_num_queued_tokens",
                                          DEFAULT_MAX_NUM_QUEUED_TOKENS))):
        for source, value in ((FLAG, getattr(limits, name)),
                              (PACKAGE, getattr(manifest, name, None)),
                              (MEASURED, measured[i] if measured else None),
                              (DEFAULT, default)):
            if value is not None:
                values[name], sources[name] = value, source
                break
    return Bounds(values["max_num_queued_reqs"], values["max_num_queued_tokens"], sources,
                  target, rates, probe_s, measured_at)


def _utc(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_s))


def apply(engine: Any, args: Any, bounds: Bounds) -> None:
    """Put the bounds in force on a running engine: vLLM's admission check reads its
    scheduler config on every request (`AsyncLLM.check_admission`)."""
    for target in (engine.scheduler_config, args):
        target.max_num_queued_reqs = bounds.max_num_queued_reqs
        target.max_num_queued_tokens = bounds.max_num_queued_tokens


@dataclass(frozen=True)
class Verdict:
    """Whether a request with a deadline can finish in time, by the measured rates."""

    estimate_s: float
    retry_after_s: float
    """When the backlog ahead of it will have been prefilled (at least 1 s)."""


def estimate(rates: Rates, queued_tokens: int, prompt_tokens: int, must_decode: int
             ) -> Verdict:
    """The least time a request needs: the prefill of the backlog and of its own prompt,
    then the tokens it must produce, one a step."""
    prefill = (queued_tokens + prompt_tokens) / rates.prefill_tokens_per_s
    backlog = queued_tokens / rates.prefill_tokens_per_s
    return Verdict(prefill + must_decode * rates.step_s, max(1.0, float(math.ceil(backlog))))


def must_decode(params: Any) -> int:
    """The output tokens a request cannot finish without: `max_tokens` when it ignores the end
    of sequence, else its `min_tokens` (0 for a pooling request)."""
    max_tokens = getattr(params, "max_tokens", None)
    if getattr(params, "ignore_eos", False) and max_tokens:
        return int(max_tokens)
    return int(getattr(params, "min_tokens", 0) or 0)
