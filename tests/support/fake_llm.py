"""A stand-in for vLLM's AsyncLLM and an LLM backend over it, for protocol tests.

The fake engine "generates" a fixed reply word by word (cumulative text, like vLLM's default
output kind) and computes deterministic prompt logprobs, with a simulated prefix cache whose
cached positions come back without logprobs, as vLLM's do.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.limits import InstanceLimits
from podium.backends.vllm import contract as vllm_contract
from podium.backends.vllm import sampling as vllm_sampling
from podium.package.manifest import TensorSpec

BOS = 1
BLOCK = 4
CONTEXT = 64
"""The fake model's context (max_model_len), in tokens."""
VOCAB = 1000
REPLY = ["Paris", " is", " the", " capital", "."]


@functools.cache
def vllm_fields() -> frozenset[str]:
    """Every field of vLLM's SamplingParams, Podium's own included."""
    import msgspec
    from vllm.sampling_params import SamplingParams

    return frozenset(f.name for f in msgspec.structs.fields(SamplingParams))


class FakeSamplingParams(dict):
    """Records the keyword arguments a real SamplingParams would get."""

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - vllm_fields()
        assert not unknown, f"not SamplingParams fields: {unknown}"
        super().__init__(kwargs)


class FakeTokenizer:
    """Words to ids: stable, so tests can compute expected logprobs."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]
        return [BOS, *ids] if add_special_tokens else ids


def token_logprob(position: int, token_id: int) -> float:
    """The fake model's log-probability of `token_id` at `position`."""
    return -0.01 * ((token_id * 7 + position * 3) % 50 + 1)


@dataclass
class FakeEngine:
    """AsyncLLM's `generate` and `get_tokenizer`, with a prefix cache of BLOCK-token blocks."""

    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    calls: list[tuple[Any, dict[str, Any], str]] = field(default_factory=list)
    cached_prefixes: set[tuple[int, ...]] = field(default_factory=set)
    word_delay_s: float = 0.0
    """How long each generated word takes (tests of slow generations)."""
    aborted: list[str] = field(default_factory=list)
    """Request ids whose generation was cancelled."""

    model_config: Any = field(default_factory=lambda: SimpleNamespace(
        max_model_len=CONTEXT, max_logprobs=20, get_vocab_size=lambda: VOCAB))

    def get_tokenizer(self) -> FakeTokenizer:
        return self.tokenizer

    async def encode(self, prompt: str, pooling_params: Any, request_id: str
                     ) -> AsyncIterator[Any]:
        """A 4-d "embedding": word count, length, first and last character codes."""
        self.calls.append((prompt, {"pooling": pooling_params}, request_id))
        vector = np.array([len(prompt.split()), len(prompt), ord(prompt[0]), ord(prompt[-1])],
                          dtype=np.float64)
        yield SimpleNamespace(outputs=SimpleNamespace(data=vector), finished=True)

    async def generate(self, prompt: Any, sampling_params: dict[str, Any], request_id: str
                       ) -> AsyncIterator[Any]:
        self.calls.append((prompt, dict(sampling_params), request_id))
        if isinstance(prompt, dict):
            ids = prompt["prompt_token_ids"]
            num_cached = 0
            if not sampling_params.get("skip_reading_prefix_cache", False):
                for end in range(BLOCK, len(ids), BLOCK):  # the last token is never cached
                    if tuple(ids[:end]) in self.cached_prefixes:
                        num_cached = end
            for end in range(BLOCK, len(ids) + 1, BLOCK):
                self.cached_prefixes.add(tuple(ids[:end]))
            logprobs: list[Any] = [None]
            for pos in range(1, len(ids)):
                logprobs.append(None if pos < num_cached else
                                {ids[pos]: SimpleNamespace(logprob=token_logprob(pos, ids[pos]))})
            # logprob_token_ids: those tokens' logprobs at the next position, as vLLM returns
            # them for the one sampled token
            asked = sampling_params.get("logprob_token_ids") or []
            sample = [{t: SimpleNamespace(logprob=token_logprob(len(ids), t)) for t in asked}]
            yield SimpleNamespace(prompt_logprobs=logprobs, num_cached_tokens=num_cached,
                                  outputs=[SimpleNamespace(text="x", logprobs=sample)],
                                  finished=True)
            return
        limit = sampling_params.get("max_tokens") or len(REPLY)
        words = REPLY[:limit]
        n = sampling_params.get("n") or 1
        try:
            for i in range(1, len(words) + 1):
                await asyncio.sleep(self.word_delay_s)
                text = "".join(words[:i])
                yield SimpleNamespace(outputs=[SimpleNamespace(text=text) for _ in range(n)],
                                      finished=i == len(words), prompt_logprobs=None)
        except asyncio.CancelledError:  # as AsyncLLM aborts a request whose caller went away
            self.aborted.append(request_id)
            raise


class FakeLlmBackend(Backend):
    """What the real VllmBackend does with vllm_contract, over the fake engine."""

    decoupled = True

    def __init__(self, package: Any, engine: FakeEngine | None = None) -> None:
        super().__init__(package)
        self.engine = engine or FakeEngine()

    async def load(self) -> None:
        # the real backend has vLLM imported once loaded; so must the fake, or the first
        # request would pay for importing vLLM's sampling types (seconds) inside its timeout
        vllm_sampling.sampling_field_types()

    async def unload(self) -> None:
        pass

    def inputs(self) -> list[TensorSpec]:
        return vllm_contract.input_specs(self.manifest.task)

    def outputs(self) -> list[TensorSpec]:
        return vllm_contract.output_specs(self.manifest.task)

    @property
    def max_batch_size(self) -> int:
        return 0

    @property
    def optional_inputs(self) -> frozenset[str]:
        return vllm_contract.optional_inputs(self.manifest.task)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        return await vllm_contract.infer(self.engine, request, task=self.manifest.task,
                                         sampling_params=FakeSamplingParams,
                                         pooling_params=dict, caps=self.caps)

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        async for response in vllm_contract.infer_stream(self.engine, request,
                                                         task=self.manifest.task,
                                                         sampling_params=FakeSamplingParams,
                                                         pooling_params=dict,
                                                         caps=self.caps):
            yield response

    @property
    def caps(self) -> InstanceLimits:
        """The instance's caps with the package's max_n, as the real backend computes them."""
        return self.limits.for_package(getattr(self.manifest, "max_n", None))
