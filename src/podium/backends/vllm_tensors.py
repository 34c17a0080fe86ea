"""Triton's vLLM-backend tensor contract, and prefill-only scoring, over an AsyncLLM-like engine.

Generation (the tensors of Triton's vLLM backend, so existing Triton clients work unchanged):

    text_input               BYTES [1]  the prompt (required for generation)
    stream                   BOOL  [1]  optional; true streams deltas (gRPC stream / SSE only)
    sampling_parameters      BYTES [1]  optional JSON of vLLM SamplingParams fields; values may
                                        be strings ("0.7"), as Triton clients send them
    exclude_input_in_output  BOOL  [1]  optional; false prepends the prompt (non-streaming only)
    → text_output            BYTES [-1] one string per sequence (`n`)

Scoring (prefill only: one forward pass per candidate, no decoding; the context's KV cache is
computed once and shared through prefix caching):

    context                  BYTES [1]  text every candidate continues
    candidates               BYTES [-1] N candidate continuations
    → logprob_sum            FP32  [-1]     per candidate: sum of its tokens' log-probabilities
    → token_logprobs         FP32  [-1, -1] per candidate and token, zero-padded
    → num_tokens             INT32 [-1]     tokens per candidate (the unpadded row length)

Embedding models (task "embed"):

    text_input               BYTES [-1] N texts
    → embedding              FP32  [-1, -1] one vector per text

The engine needs `generate(prompt, sampling_params, request_id)` (an async iterator of vLLM
`RequestOutput`s), for scoring `get_tokenizer()`, and for embeddings `encode(prompt,
pooling_params, request_id)`. Nothing here imports vLLM until a `SamplingParams` or
`PoolingParams` is built, and tests pass stand-ins.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import numpy as np

from podium.backends import vllm_checks as checks
from podium.backends.base import InferenceRequest, InferenceResponse, Tensor
from podium.errors import InvalidArgument
from podium.package.manifest import TensorSpec

GENERATE_INPUTS = [
    TensorSpec(name="text_input", datatype="BYTES", shape=[1]),
    TensorSpec(name="stream", datatype="BOOL", shape=[1]),
    TensorSpec(name="sampling_parameters", datatype="BYTES", shape=[1]),
    TensorSpec(name="exclude_input_in_output", datatype="BOOL", shape=[1]),
]
SCORE_INPUTS = [
    TensorSpec(name="context", datatype="BYTES", shape=[1]),
    TensorSpec(name="candidates", datatype="BYTES", shape=[-1]),
]
GENERATE_OUTPUTS = [TensorSpec(name="text_output", datatype="BYTES", shape=[-1])]
SCORE_OUTPUTS = [
    TensorSpec(name="logprob_sum", datatype="FP32", shape=[-1]),
    TensorSpec(name="token_logprobs", datatype="FP32", shape=[-1, -1]),
    TensorSpec(name="num_tokens", datatype="INT32", shape=[-1]),
]
LLM_INPUTS = GENERATE_INPUTS + SCORE_INPUTS
"""Inputs an LLM backend declares (with max_batch_size 0)."""
LLM_OUTPUTS = GENERATE_OUTPUTS + SCORE_OUTPUTS
"""Outputs an LLM backend declares; a response carries those of its mode."""
LLM_OPTIONAL_INPUTS = frozenset(spec.name for spec in LLM_INPUTS)
"""Every LLM input is optional to the generic checks; `infer` checks each mode's own."""
EMBED_INPUTS = [TensorSpec(name="text_input", datatype="BYTES", shape=[-1])]
EMBED_OUTPUTS = [TensorSpec(name="embedding", datatype="FP32", shape=[-1, -1])]


def input_specs(task: str = "generate") -> list[TensorSpec]:
    """The inputs a vLLM model of `task` ("generate" or "embed") declares."""
    return EMBED_INPUTS if task == "embed" else LLM_INPUTS


def output_specs(task: str = "generate") -> list[TensorSpec]:
    """The outputs a vLLM model of `task` declares."""
    return EMBED_OUTPUTS if task == "embed" else LLM_OUTPUTS


def optional_inputs(task: str = "generate") -> frozenset[str]:
    """Inputs the generic checks let a request omit (each mode checks its own)."""
    return frozenset() if task == "embed" else LLM_OPTIONAL_INPUTS

# SamplingParams fields a request may set, by how a string value converts (Triton's rule)
_INT_FIELDS = {"n", "top_k", "max_tokens", "min_tokens", "seed", "logprobs", "prompt_logprobs"}
_FLOAT_FIELDS = {"presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
                 "top_p", "min_p"}
_BOOL_FIELDS = {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                "include_stop_str_in_output"}
_LIST_FIELDS = {"stop", "stop_token_ids", "bad_words", "allowed_token_ids"}
SAMPLING_FIELDS = _INT_FIELDS | _FLOAT_FIELDS | _BOOL_FIELDS | _LIST_FIELDS


class EngineClient(Protocol):
    """The slice of vLLM's `AsyncLLM` this module uses (`model_config`: vLLM's ModelConfig,
    read for `max_model_len`, `max_logprobs` and `get_vocab_size()`)."""

    model_config: Any

    def generate(self, prompt: Any, sampling_params: Any, request_id: str) -> AsyncIterator[Any]:
        ...

    def get_tokenizer(self) -> Any:
        ...


SamplingFactory = Callable[..., Any]


def _vllm_sampling_params(**kwargs: Any) -> Any:
    from vllm import SamplingParams  # heavy: imported on the first LLM request only

    return SamplingParams(**kwargs)


def _vllm_pooling_params() -> Any:
    from vllm import PoolingParams

    return PoolingParams(task="embed")


# -- entry points for an LLM backend ---------------------------------------------------------
async def infer(engine: EngineClient, request: InferenceRequest, *, task: str = "generate",
                sampling_params: SamplingFactory = _vllm_sampling_params,
                pooling_params: Callable[[], Any] = _vllm_pooling_params) -> InferenceResponse:
    """One response: generation (stream must be false), scoring, or embeddings."""
    if task == "embed":
        return await embed(engine, request, pooling_params=pooling_params)
    if "candidates" in request.inputs or "context" in request.inputs:
        return await score(engine, request, sampling_params=sampling_params)
    if _flag(request, "stream"):
        raise InvalidArgument("stream=true needs a streaming call: gRPC ModelStreamInfer or "
                              "POST /v2/models/{m}/generate_stream", param="stream")
    last = None
    async for response in generate(engine, request, sampling_params=sampling_params):
        last = response
    assert last is not None  # generate always yields its final response
    return last


async def infer_stream(engine: EngineClient, request: InferenceRequest, *,
                       task: str = "generate",
                       sampling_params: SamplingFactory = _vllm_sampling_params,
                       pooling_params: Callable[[], Any] = _vllm_pooling_params
                       ) -> AsyncIterator[InferenceResponse]:
    """Decoupled: deltas while generating when stream=true, else one response."""
    if task == "embed":
        yield await embed(engine, request, pooling_params=pooling_params)
        return
    if "candidates" in request.inputs or "context" in request.inputs:
        yield await score(engine, request, sampling_params=sampling_params)
        return
    async for response in generate(engine, request, sampling_params=sampling_params):
        yield response


# -- generation -------------------------------------------------------------------------------
async def generate(engine: EngineClient, request: InferenceRequest, *,
                   sampling_params: SamplingFactory = _vllm_sampling_params
                   ) -> AsyncIterator[InferenceResponse]:
    """Run one prompt; stream=true yields text deltas, else a single final response."""
    prompt = _text(request, "text_input", required=True)
    stream = _flag(request, "stream")
    exclude_input = _flag(request, "exclude_input_in_output")
    with checks.nesting_limit("sampling_parameters"):
        kwargs = parse_sampling_parameters(request)
    await checks.check_generation(engine, prompt, kwargs)
    params = _build_sampling_params(sampling_params, kwargs)
    request_id = request.id or uuid.uuid4().hex
    sent: list[int] = []
    final = None
    with checks.engine_rejections():
        async for output in engine.generate(prompt, params, request_id):
            final = output
            if stream:
                texts = [c.text for c in output.outputs]
                sent += [0] * (len(texts) - len(sent))
                deltas = [t[n:] for t, n in zip(texts, sent, strict=False)]
                sent = [len(t) for t in texts]
                yield _text_response(deltas, request, final=bool(output.finished))
    if final is None:
        raise InvalidArgument("the engine produced no output for this prompt")
    if not stream:
        prefix = "" if exclude_input else prompt
        yield _text_response([prefix + c.text for c in final.outputs], request, final=True)


def _build_sampling_params(factory: SamplingFactory, kwargs: dict[str, Any]) -> Any:
    """SamplingParams validates value ranges itself; a bad value is the client's error."""
    try:
        return factory(**kwargs)
    except Exception as exc:
        from vllm.exceptions import VLLMClientError

        if isinstance(exc, ValueError | TypeError | VLLMClientError):
            raise InvalidArgument(f"sampling_parameters: {exc}", param="sampling_parameters"
                                  ) from None
        raise


def parse_sampling_parameters(request: InferenceRequest) -> dict[str, Any]:
    """SamplingParams keyword arguments from the `sampling_parameters` JSON tensor and the
    request's parameters (the tensor wins); unknown fields are rejected by name."""
    merged: dict[str, Any] = {}
    for key, value in request.parameters.items():
        if key in SAMPLING_FIELDS or key == "constraint":
            merged[key] = value
        else:
            known = ", ".join(sorted(SAMPLING_FIELDS | {"constraint"}))
            raise InvalidArgument(f"request parameter {key!r} is not a sampling parameter "
                                  f"(known: {known})", param=key)
    raw = _text(request, "sampling_parameters", required=False)
    if raw:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"sampling_parameters is not valid JSON ({exc.msg} at "
                                  f"character {exc.pos}): {raw[:80]!r}",
                                  param="sampling_parameters") from None
        if not isinstance(data, dict):
            raise InvalidArgument(f"sampling_parameters must be a JSON object, got {raw[:80]!r}",
                                  param="sampling_parameters")
        merged.update(data)
    constraint = _constraint(merged.pop("constraint", None))
    kwargs = {key: _convert(key, value) for key, value in merged.items()}
    if constraint is not None:  # enforced in the decoding loop by the constraint processor
        from podium.constraints import check_sampling, to_vllm_xargs, validate_constraint

        normalized = validate_constraint(constraint)
        check_sampling(min_tokens=kwargs.get("min_tokens"))
        kwargs["extra_args"] = to_vllm_xargs(normalized)
    return kwargs


def _constraint(value: Any) -> Any:
    """The constraint object; a request parameter may hold it as JSON text (gRPC parameters
    carry only scalars)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"constraint is not valid JSON ({exc.msg} at character "
                              f"{exc.pos}): {value[:80]!r}; send the constraint object, or its "
                              "JSON text where parameters must be scalars (gRPC)",
                              param="constraint") from None


def _convert(key: str, value: Any) -> Any:
    """A sampling parameter in its SamplingParams type; strings convert as Triton's do."""
    if key not in SAMPLING_FIELDS:
        raise InvalidArgument(f"sampling parameter {key!r} is unknown (known: "
                              f"{', '.join(sorted(SAMPLING_FIELDS))})", param=key)
    try:
        return _CONVERTERS[_kind(key)](key, value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"sampling parameter {key}={value!r} must be {_kind(key)}",
                              param=key) from None


def _kind(key: str) -> str:
    return ("an integer" if key in _INT_FIELDS else "a number" if key in _FLOAT_FIELDS
            else "true or false" if key in _BOOL_FIELDS else "a list")


def _to_int(key: str, value: Any) -> int | None:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return None if value is None else int(value)


def _to_bool(key: str, value: Any) -> bool:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, bool):
        return value
    raise ValueError(value)


def _to_list(key: str, value: Any) -> list[Any]:
    if key == "stop" and isinstance(value, str):
        return [value]
    if isinstance(value, str):  # Triton clients send lists as JSON strings too
        value = json.loads(value)  # JSONDecodeError is a ValueError
    if not isinstance(value, list):
        raise ValueError(value)
    return value


_CONVERTERS: dict[str, Callable[[str, Any], Any]] = {
    "an integer": _to_int,
    "a number": lambda key, value: float(value),
    "true or false": _to_bool,
    "a list": _to_list,
}


def _text_response(texts: list[str], request: InferenceRequest, *, final: bool
                   ) -> InferenceResponse:
    data = np.empty(len(texts), dtype=object)
    data[:] = [t.encode() for t in texts]
    return InferenceResponse(outputs=[Tensor("text_output", "BYTES", data)], id=request.id,
                             final=final)


# -- prefill-only scoring ---------------------------------------------------------------------
async def score(engine: Any, request: InferenceRequest, *,
                sampling_params: SamplingFactory = _vllm_sampling_params) -> InferenceResponse:
    """Each candidate's log-probability given the context, from prefill alone."""
    for name in ("text_input", "stream", "exclude_input_in_output"):
        if name in request.inputs:
            raise InvalidArgument(f"input {name!r} is for generation; scoring takes context "
                                  "and candidates only", param=name)
    if request.parameters or "sampling_parameters" in request.inputs:
        raise InvalidArgument("scoring takes no sampling parameters (it never samples)",
                              param="sampling_parameters")
    context = _text(request, "context", required=True)
    if "candidates" not in request.inputs:
        raise InvalidArgument("input 'candidates' is missing; scoring needs BYTES [N] "
                              "continuations", param="candidates")
    candidates = [_utf8("candidates", c) for c in request.inputs["candidates"].data.reshape(-1)]
    if not candidates:
        raise InvalidArgument("input 'candidates' is empty; send at least one",
                              param="candidates")
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


# -- embeddings -------------------------------------------------------------------------------
async def embed(engine: Any, request: InferenceRequest, *,
                pooling_params: Callable[[], Any] = _vllm_pooling_params) -> InferenceResponse:
    """One vector per `text_input` string, encoded concurrently."""
    tensor = request.inputs.get("text_input")
    if tensor is None:
        raise InvalidArgument("input 'text_input' is missing; send BYTES [N] texts",
                              param="text_input")
    texts = [_utf8("text_input", v) for v in tensor.data.reshape(-1)]
    if not texts:
        raise InvalidArgument("input 'text_input' is empty; send at least one text",
                              param="text_input")
    if request.parameters:
        raise InvalidArgument(f"embedding requests take no parameters (got "
                              f"{sorted(request.parameters)})", param=sorted(request.parameters)[0])
    base = request.id or uuid.uuid4().hex

    async def one(index: int) -> np.ndarray:
        final = None
        async for output in engine.encode(texts[index], pooling_params(), f"{base}-{index}"):
            final = output
        data = final.outputs.data
        if hasattr(data, "float"):  # a torch tensor
            data = data.float().cpu().numpy()
        return np.asarray(data, dtype=np.float32).reshape(-1)

    vectors = await asyncio.gather(*(one(i) for i in range(len(texts))))
    return InferenceResponse(outputs=[Tensor("embedding", "FP32", np.stack(vectors))],
                             id=request.id)


# -- tensor helpers ---------------------------------------------------------------------------
def _text(request: InferenceRequest, name: str, *, required: bool) -> str:
    tensor = request.inputs.get(name)
    if tensor is None:
        if required:
            raise InvalidArgument(f"input {name!r} is missing", param=name)
        return ""
    values = tensor.data.reshape(-1)
    if values.size != 1:
        raise InvalidArgument(f"input {name!r} must hold one string, got {values.size}",
                              param=name)
    return _utf8(name, values[0])


def _utf8(name: str, value: Any) -> str:
    try:
        return value.decode() if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"input {name!r} is not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})", param=name) from None


def _flag(request: InferenceRequest, name: str) -> bool:
    tensor = request.inputs.get(name)
    if tensor is None:
        return False
    values = tensor.data.reshape(-1)
    if values.size != 1:
        raise InvalidArgument(f"input {name!r} must hold one BOOL, got {values.size}",
                              param=name)
    return bool(values[0])
