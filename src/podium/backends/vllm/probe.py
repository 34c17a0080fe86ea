"""The engine's speed, measured once after its warm-up: the rates `admission` sizes bounds by.

Two parts, a second or two in all on a small CPU model, before the instance reports ready:

1. prefill: one prompt of `PREFILL_TOKENS` token ids (random, so no prefix is cached) with
   one output token, twice; the faster run's tokens per second (the first may pay for a shape
   the warm-up did not touch);
2. decode: `BATCH` requests at once, each a short prompt and `DECODE_TOKENS` output tokens
   (`ignore_eos`); the output tokens made after the last of them got its first token, per
   second: the batch's decode rate, prefill excluded.

A pooling model (embeddings) has no decode: only the prefill part runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

from podium.backends.vllm.admission import Rates

PREFILL_TOKENS = 256
BATCH = 8
DECODE_PROMPT_TOKENS = 8
DECODE_TOKENS = 10


async def measure(engine: Any, task: str) -> Rates:
    """The engine's prefill and decode rates (see the module's docstring)."""
    config = engine.model_config
    vocab = int(config.get_vocab_size())
    length = max(1, min(PREFILL_TOKENS, int(config.max_model_len) - DECODE_TOKENS - 2))
    ids = _Ids(vocab)
    started = time.monotonic()
    times = [await _prefill(engine, task, ids.take(length), f"podium-probe-prefill-{i}")
             for i in range(2)]
    prefill_s = time.monotonic() - started
    prefill = length / max(min(times), 1e-6)
    if task == "embed":
        return Rates(prefill, length, prefill_s, None, 1, 0.0)
    batch = max(1, min(BATCH, int(engine.vllm_config.scheduler_config.max_num_seqs)))
    started = time.monotonic()
    decode = await _decode(engine, [ids.take(DECODE_PROMPT_TOKENS) for _ in range(batch)])
    return Rates(prefill, length, prefill_s, decode, batch, time.monotonic() - started)


class _Ids:
    """Token ids no other prompt shares (above the special tokens' usual range)."""

    def __init__(self, vocab: int) -> None:
        self.vocab, self.rng = vocab, random.Random(0x5EED)

    def take(self, n: int) -> list[int]:
        low = min(1000, self.vocab // 2)
        return [self.rng.randrange(low, self.vocab) for _ in range(n)]


async def _prefill(engine: Any, task: str, ids: list[int], request_id: str) -> float:
    """Seconds from sending one prompt to its first output (its prefill)."""
    from vllm import PoolingParams, SamplingParams

    started = time.monotonic()
    if task == "embed":
        stream = engine.encode({"prompt_token_ids": ids}, PoolingParams(task="embed"),
                               request_id=request_id)
    else:
        stream = engine.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1),
                                 request_id=request_id)
    async for _ in stream:
        pass
    return time.monotonic() - started


async def _decode(engine: Any, prompts: list[list[int]]) -> float | None:
    """Output tokens per second of the batch once every sequence is decoding."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=DECODE_TOKENS, ignore_eos=True)

    async def run(i: int, ids: list[int]) -> list[tuple[float, int]]:
        """(when, tokens made so far) at each output of one sequence."""
        seen: list[tuple[float, int]] = []
        async for output in engine.generate({"prompt_token_ids": ids}, params,
                                            request_id=f"podium-probe-decode-{i}"):
            seen.append((time.monotonic(), len(output.outputs[0].token_ids)))
        return seen

    runs = [seen for seen in await asyncio.gather(*(run(i, ids) for i, ids in
                                                    enumerate(prompts))) if seen]
    if not runs:
        return None
    begin = max(seen[0][0] for seen in runs)  # every sequence is decoding from here
    end = max(seen[-1][0] for seen in runs)
    made = sum(seen[-1][1] - max(count for when, count in seen if when <= begin)
               for seen in runs)
    if end <= begin or made <= 0:
        return None
    return made / (end - begin)


PREFIX = "podium-probe-"
"""The probe's request ids begin so (vLLM keeps the id as the prefix of its internal one)."""


class Disturbed(Exception):
    """Another request reached the engine while the probe ran: its figures are not the
    engine's own, and its requests were aborted so the other request is not slowed."""


def others_in_flight(engine: Any) -> int:
    """Requests in the engine that are not the probe's (0 where the engine does not say)."""
    states = getattr(getattr(engine, "output_processor", None), "request_states", None) or {}
    return sum(1 for request_id in list(states) if not str(request_id).startswith(PREFIX))


async def measure_undisturbed(engine: Any, task: str, poll_s: float = 0.02) -> Rates:
    """`measure`, aborted with `Disturbed` as soon as another request is in the engine (the
    re-measurement after ready yields to traffic)."""
    if others_in_flight(engine):
        raise Disturbed("the engine is serving")
    probe = asyncio.ensure_future(measure(engine, task))
    while not probe.done():
        if others_in_flight(engine):
            probe.cancel()  # vLLM aborts a request whose stream is cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            raise Disturbed("a request arrived while measuring")
        await asyncio.wait({probe}, timeout=poll_s)
    return probe.result()


async def until_idle(engine: Any, idle_s: float, poll_s: float = 0.1) -> None:
    """Return once the engine has had no request for `idle_s` seconds."""
    quiet_since = time.monotonic()
    while True:
        if others_in_flight(engine):
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= idle_s:
            return
        await asyncio.sleep(poll_s)
