"""Prefill-only scoring: one forward pass per candidate, no decoding; the context's KV cache is
computed once and shared through prefix caching.

    context                  BYTES [1]  text every candidate continues
    candidates               BYTES [-1] N candidate continuations
    → logprob_sum            FP32  [-1]     per candidate: sum of its tokens' log-probabilities
    → token_logprobs         FP32  [-1, -1] per candidate and token, zero-padded
    → num_tokens             INT32 [-1]     tokens per candidate (the unpadded row length)

The engine needs `generate` (as for generation), `get_tokenizer()` and `model_config` (at
most `vllm_checks.MAX_CANDIDATES`, each fitting the context with the text).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import uuid
from typing import Any

import numpy as np

from podium.backends.base import InferenceRequest, InferenceResponse, Tensor
from podium.backends.tensor_text import read_text, read_texts
from podium.backends.vllm import checks as checks
from podium.backends.vllm.sampling import SamplingFactory, vllm_sampling_params
from podium.errors import InvalidArgument
from podium.package.manifest import TensorSpec

SCORE_INPUTS = [
    TensorSpec(name="context", datatype="BYTES", shape=[1]),
    TensorSpec(name="candidates", datatype="BYTES", shape=[-1]),
]
SCORE_OUTPUTS = [
    TensorSpec(name="logprob_sum", datatype="FP32", shape=[-1]),
    TensorSpec(name="token_logprobs", datatype="FP32", shape=[-1, -1]),
    TensorSpec(name="num_tokens", datatype="INT32", shape=[-1]),
]


def is_scoring(request: InferenceRequest) -> bool:
    """A request carrying scoring's inputs is a scoring request."""
    return "candidates" in request.inputs or "context" in request.inputs


async def score(engine: Any, request: InferenceRequest, *,
                sampling_params: SamplingFactory = vllm_sampling_params) -> InferenceResponse:
    """Each candidate's log-probability given the context, from prefill alone."""
    for name in ("text_input", "stream", "exclude_input_in_output"):
        if name in request.inputs:
            raise InvalidArgument(f"input {name!r} is for generation; scoring takes context "
                                  "and candidates only", param=name)
    if request.parameters or "sampling_parameters" in request.inputs:
        raise InvalidArgument("scoring takes no sampling parameters (it never samples)",
                              param="sampling_parameters")
    context = read_text(request, "context", required=True)
    candidates = read_texts(request, "candidates", what="continuations")
    tokenizer = engine.get_tokenizer()
    if inspect.isawaitable(tokenizer):
        tokenizer = await tokenizer
    context_ids = list(tokenizer.encode(context))
    candidate_ids = [list(tokenizer.encode(c, add_special_tokens=False)) for c in candidates]
    for text, ids in zip(candidates, candidate_ids, strict=True):
        if not ids:
            raise InvalidArgument(f"candidate {text!r} has no tokens; drop it",
                                  param="candidates")
    checks.check_scoring(engine, context_ids, candidate_ids)
    base = request.id or uuid.uuid4().hex
    # 1. the context alone: fills the prefix cache with its KV blocks and scores every
    #    candidate's first token (the row that predicts it is the context's last one, which a
    #    cached context would never recompute)
    first = await first_token_logprobs(engine, context_ids, [ids[0] for ids in candidate_ids],
                                       f"{base}-context", sampling_params)

    # 2. every candidate's remaining tokens at once, reading the context from the cache
    async def tail(index: int) -> list[float]:
        ids = candidate_ids[index]
        if len(ids) == 1:
            return []
        return await score_tokens(engine, context_ids + ids[:1], ids[1:],
                                  f"{base}-score-{index}", sampling_params)

    tails = await asyncio.gather(*(tail(i) for i in range(len(candidates))))
    per_token = [[first[ids[0]], *rest] for ids, rest in zip(candidate_ids, tails, strict=True)]
    width = max(len(row) for row in per_token)
    padded = np.zeros((len(per_token), width), dtype=np.float32)
    for i, row in enumerate(per_token):
        padded[i, :len(row)] = row
    return InferenceResponse(id=request.id, outputs=[
        Tensor("logprob_sum", "FP32", np.array([sum(r) for r in per_token], dtype=np.float32)),
        Tensor("token_logprobs", "FP32", padded),
        Tensor("num_tokens", "INT32", np.array([len(r) for r in per_token], dtype=np.int32)),
    ])


MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's per-request cap on logprob_token_ids


async def first_token_logprobs(engine: Any, context_ids: list[int], token_ids: list[int],
                               request_id: str, sampling_params: SamplingFactory
                               ) -> dict[int, float]:
    """log P(token | context) for each token, from one pass over the context."""
    wanted = sorted(set(token_ids))
    found: dict[int, float] = {}
    for start in range(0, len(wanted), MAX_LOGPROB_TOKEN_IDS):
        chunk = wanted[start:start + MAX_LOGPROB_TOKEN_IDS]
        params = sampling_params(max_tokens=1, temperature=0.0, logprob_token_ids=chunk,
                                 detokenize=False)
        final = None
        async for output in engine.generate({"prompt_token_ids": context_ids}, params,
                                            f"{request_id}-{start}"):
            final = output
        entries = final.outputs[0].logprobs[0] if final and final.outputs[0].logprobs else {}
        for token_id in chunk:
            if token_id not in entries:
                raise InvalidArgument(f"the engine returned no log-probability for token "
                                      f"{token_id}; is this a generative model?")
            entry = entries[token_id]
            found[token_id] = float(getattr(entry, "logprob", entry))
    return found


async def score_tokens(engine: Any, context_ids: list[int], candidate_ids: list[int],
                       request_id: str, sampling_params: SamplingFactory) -> list[float]:
    """Log-probabilities of `candidate_ids` after `context_ids`: prompt logprobs, 1 token out."""
    prompt = {"prompt_token_ids": context_ids + candidate_ids}
    for read_cache in (True, False):
        # vLLM skips the prefix cache for prompt-logprob requests unless told otherwise: the
        # cached context has no logprobs, which is fine as long as the candidate's tokens do
        # detokenize=False: positions served from the prefix cache carry placeholder token ids
        # that vLLM's output processor cannot decode (an OverflowError that kills the engine's
        # output handler); scoring needs ids and logprobs only
        params = sampling_params(max_tokens=1, temperature=0.0, prompt_logprobs=0,
                                 skip_reading_prefix_cache=not read_cache, detokenize=False)
        final = None
        async for output in engine.generate(prompt, params, f"{request_id}-{int(read_cache)}"):
            final = output
        logprobs = _candidate_logprobs(getattr(final, "prompt_logprobs", None), candidate_ids)
        if logprobs is not None:
            return logprobs
    raise InvalidArgument(f"the engine returned no prompt logprobs for request {request_id}; "
                          "is this a generative model?")


def _candidate_logprobs(prompt_logprobs: Any, candidate_ids: list[int]) -> list[float] | None:
    """The last len(candidate) positions' logprobs of the actual tokens, or None if missing."""
    if not prompt_logprobs or len(prompt_logprobs) < len(candidate_ids):
        return None
    tail = list(prompt_logprobs)[-len(candidate_ids):]
    values = []
    for token_id, position in zip(candidate_ids, tail, strict=True):
        if not position or token_id not in position:
            return None
        entry = position[token_id]
        value = float(getattr(entry, "logprob", entry))
        if math.isnan(value):
            return None
        values.append(value)
    return values
