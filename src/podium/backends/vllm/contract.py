"""Triton's vLLM-backend contract over an AsyncLLM-like engine: which tensors a vLLM model
declares, and which mode a request runs (generation, scoring or embeddings).

Each mode is its own module: `generate`, `scoring`, `embeddings`; sampling
fields are coerced in `sampling`. Nothing here imports vLLM until a `SamplingParams` or
`PoolingParams` is built, and tests pass stand-ins.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from podium.backends.base import InferenceRequest, InferenceResponse
from podium.backends.limits import InstanceLimits
from podium.backends.vllm.embeddings import EMBED_INPUTS, EMBED_OUTPUTS, embed, vllm_pooling_params
from podium.backends.vllm.generate import (
    GENERATE_INPUTS,
    GENERATE_OUTPUTS,
    EngineClient,
    generate,
    generate_once,
)
from podium.backends.vllm.sampling import SamplingFactory, vllm_sampling_params
from podium.backends.vllm.scoring import SCORE_INPUTS, SCORE_OUTPUTS, is_scoring, score
from podium.package.manifest import TensorSpec

LLM_INPUTS = GENERATE_INPUTS + SCORE_INPUTS
"""Inputs an LLM backend declares (with max_batch_size 0)."""
LLM_OUTPUTS = GENERATE_OUTPUTS + SCORE_OUTPUTS
"""Outputs an LLM backend declares; a response carries those of its mode."""


def input_specs(task: str = "generate") -> list[TensorSpec]:
    """The inputs a vLLM model of `task` ("generate" or "embed") declares."""
    return EMBED_INPUTS if task == "embed" else LLM_INPUTS


def output_specs(task: str = "generate") -> list[TensorSpec]:
    """The outputs a vLLM model of `task` declares."""
    return EMBED_OUTPUTS if task == "embed" else LLM_OUTPUTS


def optional_inputs(task: str = "generate") -> frozenset[str]:
    """Inputs the generic checks let a request omit: every LLM input, as each mode checks its
    own; none for embeddings."""
    return frozenset() if task == "embed" else frozenset(spec.name for spec in LLM_INPUTS)


async def infer(engine: EngineClient, request: InferenceRequest, *, task: str = "generate",
                sampling_params: SamplingFactory = vllm_sampling_params,
                pooling_params: Callable[[], Any] = vllm_pooling_params,
                caps: InstanceLimits = InstanceLimits()) -> InferenceResponse:
    """One response: generation (stream must be false), scoring, or embeddings."""
    if task == "embed":
        return await embed(engine, request, pooling_params=pooling_params)
    if is_scoring(request):
        return await score(engine, request, sampling_params=sampling_params)
    return await generate_once(engine, request, sampling_params=sampling_params, caps=caps)


async def infer_stream(engine: EngineClient, request: InferenceRequest, *,
                       task: str = "generate",
                       sampling_params: SamplingFactory = vllm_sampling_params,
                       pooling_params: Callable[[], Any] = vllm_pooling_params,
                       caps: InstanceLimits = InstanceLimits()
                       ) -> AsyncIterator[InferenceResponse]:
    """Decoupled: deltas while generating when stream=true, else one response."""
    if task == "embed":
        yield await embed(engine, request, pooling_params=pooling_params)
    elif is_scoring(request):
        yield await score(engine, request, sampling_params=sampling_params)
    else:
        async for response in generate(engine, request, sampling_params=sampling_params,
                                       caps=caps):
            yield response
