"""Generation over Triton's vLLM-backend tensor contract, so existing Triton clients work
unchanged:

    text_input               BYTES [1]  the prompt (required for generation)
    stream                   BOOL  [1]  optional; true streams deltas (gRPC stream / SSE only)
    sampling_parameters      BYTES [1]  optional JSON of vLLM SamplingParams fields; values may
                                        be strings ("0.7"), as Triton clients send them
    exclude_input_in_output  BOOL  [1]  optional; false prepends the prompt (non-streaming only)
    → text_output            BYTES [-1] one string per sequence (`n`)

The engine needs `generate(prompt, sampling_params, request_id)`, an async iterator of vLLM
`RequestOutput`s with cumulative text, and `model_config` and `get_tokenizer()` for the checks
against the model (`vllm_checks`: the prompt is tokenized once more for its length).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from podium.backends.base import InferenceRequest, InferenceResponse
from podium.backends.limits import InstanceLimits
from podium.backends.tensor_text import read_flag, read_text, text_tensor
from podium.backends.vllm import checks, constraint
from podium.backends.vllm.sampling import (
    SamplingFactory,
    build_sampling_params,
    parse_sampling_parameters,
    vllm_sampling_params,
)
from podium.errors import InvalidArgument
from podium.package.manifest import TensorSpec

GENERATE_INPUTS = [
    TensorSpec(name="text_input", datatype="BYTES", shape=[1]),
    TensorSpec(name="stream", datatype="BOOL", shape=[1]),
    TensorSpec(name="sampling_parameters", datatype="BYTES", shape=[1]),
    TensorSpec(name="exclude_input_in_output", datatype="BOOL", shape=[1]),
]
COMPILE_PARAMETER = "constraint_compile_seconds"
"""Response parameter: the seconds this request waited for its constraint's compiled form
(0 on a cache hit; absent without a constraint), as the OpenAI answer's field of that name."""
GENERATE_OUTPUTS = [TensorSpec(name="text_output", datatype="BYTES", shape=[-1])]


class EngineClient(Protocol):
    """The slice of vLLM's `AsyncLLM` generation uses (`model_config`: vLLM's ModelConfig,
    read for `max_model_len`, `max_logprobs` and `get_vocab_size()`)."""

    model_config: Any

    def generate(self, prompt: Any, sampling_params: Any, request_id: str) -> AsyncIterator[Any]:
        ...

    def get_tokenizer(self) -> Any:
        ...


async def generate(engine: EngineClient, request: InferenceRequest, *,
                   sampling_params: SamplingFactory = vllm_sampling_params,
                   caps: InstanceLimits = InstanceLimits()
                   ) -> AsyncIterator[InferenceResponse]:
    """Run one prompt; stream=true yields text deltas, else a single final response."""
    prompt = read_text(request, "text_input", required=True)
    stream = read_flag(request, "stream")
    exclude_input = read_flag(request, "exclude_input_in_output")
    with checks.nesting_limit("sampling_parameters"):
        kwargs = parse_sampling_parameters(request)
    await checks.check_generation(engine, prompt, kwargs, caps)
    # a constraint is compiled here, off the event loop, never in the engine step
    compile_seconds = await constraint.precompile(kwargs.get("extra_args"), engine)
    extra = {} if compile_seconds is None else {COMPILE_PARAMETER: round(compile_seconds, 6)}
    params = build_sampling_params(sampling_params, kwargs)
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
                yield _text_response(deltas, request, final=bool(output.finished), extra=extra)
                extra = {}  # said once, on the stream's first response
    if final is None:
        raise InvalidArgument("the engine produced no output for this prompt")
    if not stream:
        prefix = "" if exclude_input else prompt
        yield _text_response([prefix + c.text for c in final.outputs], request, final=True,
                             extra=extra)


async def generate_once(engine: EngineClient, request: InferenceRequest, *,
                        sampling_params: SamplingFactory = vllm_sampling_params,
                        caps: InstanceLimits = InstanceLimits()
                        ) -> InferenceResponse:
    """The final response of a non-streaming generation (stream must be false)."""
    if read_flag(request, "stream"):
        raise InvalidArgument("stream=true needs a streaming call: gRPC ModelStreamInfer or "
                              "POST /v2/models/{m}/generate_stream", param="stream")
    last = None
    async for response in generate(engine, request, sampling_params=sampling_params,
                                   caps=caps):
        last = response
    assert last is not None  # generate always yields its final response
    return last


def _text_response(texts: list[str], request: InferenceRequest, *, final: bool,
                   extra: dict[str, Any]) -> InferenceResponse:
    return InferenceResponse(outputs=[text_tensor("text_output", texts)], id=request.id,
                             final=final, parameters=dict(extra))
