"""The instance's bounds a backend applies (`podium serve` flags): queue admission and the
caps on what one LLM request may ask, on every protocol (OpenAI and KServe read this one type).

Admission settings resolve in one order everywhere: a flag given to `podium serve` wins (the
operator knows the machine), else the package's manifest, else the default here. The `n` cap
is the exception: the package's `max_n` wins over `--max-n` (`InstanceLimits.n_cap`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_MAX_NUM_QUEUED_REQS = 256
"""Requests one vLLM engine holds (waiting and running) before it refuses more, while it
starts and where its speed could not be measured (else the measured bound replaces it)."""
DEFAULT_MAX_NUM_QUEUED_TOKENS = 65536
"""Prompt tokens of requests still in prefill one vLLM engine holds before it refuses more
(the same: until the measured bound replaces it)."""
DEFAULT_ADMISSION_TARGET_WAIT_S = 30.0
"""The wait an LLM engine's measured admission bounds are sized to."""


@dataclass(frozen=True)
class InstanceLimits:
    """What `podium serve` was told, for every backend it loads; None: not given."""

    max_queue: int | None = None
    """Overrides every package's `dynamic_batching.max_queue` (`--max-queue`)."""
    queue_timeout_ms: int | None = None
    """Overrides every package's `dynamic_batching.queue_timeout_ms` (`--queue-timeout-ms`)."""
    max_num_queued_reqs: int | None = None
    """Overrides every LLM package's `max_num_queued_reqs` (`--max-num-queued-reqs`)."""
    max_num_queued_tokens: int | None = None
    """Overrides every LLM package's `max_num_queued_tokens` (`--max-num-queued-tokens`)."""
    admission_target_wait_s: float = DEFAULT_ADMISSION_TARGET_WAIT_S
    """The wait the derived bounds of an LLM engine are sized to (`--admission-target-wait-s`):
    where neither the flag nor the package sets a `max_num_queued_*`, the bound is the work the
    engine was measured to finish in this time (`backends.vllm.admission`)."""
    classic_target_wait_s: float | None = None
    """The wait a classic model's measured in-flight bound is sized to
    (`--classic-target-wait-s`); None: the package's `admission_target_wait_s`, else 0.02 s
    (`backends.classic_admission`)."""
    max_n: int = 16
    """Sequences per LLM request unless the package's `max_n` says otherwise (`--max-n`)."""
    max_stop_strings: int = 16
    """Entries of stop, stop_token_ids and bad_words, each (`--max-stop-strings`)."""
    max_stop_chars: int = 1024
    """Characters of one stop string or bad word (`--max-stop-chars`)."""
    max_messages: int = 1024
    """Entries of an OpenAI request's `messages` (`--max-messages`)."""
    max_batch_conversations: int = 64
    """Conversations of one /v1/chat/completions/batch request, each an engine request
    (`--max-batch-conversations`)."""

    n_from_package: bool = False
    """True when `max_n` is a package's own (`for_package`): the fix a 400 names differs."""

    def for_package(self, package_max_n: int | None) -> InstanceLimits:
        """These limits for one model: its package's `max_n`, when it sets one, wins."""
        if package_max_n is None:
            return self
        return replace(self, max_n=package_max_n, n_from_package=True)

    @property
    def how_to_raise_n(self) -> str:
        return ("raise it with max_n in the package's manifest" if self.n_from_package else
                "raise it with `podium serve --max-n`, or with max_n in the package's manifest")


def resolve(flag: int | None, package: int | None, default: int) -> int:
    """The setting in force: the flag's, else the package's, else the default."""
    if flag is not None:
        return flag
    return default if package is None else package
