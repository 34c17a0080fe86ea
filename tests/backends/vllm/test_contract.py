"""Triton's vLLM tensor contract: generation and prefill-only scoring, over a fake AsyncLLM."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from podium.backends.base import InferenceRequest, Tensor
from podium.backends.vllm import contract as vllm_contract
from podium.errors import InvalidArgument
from tests.support.fake_llm import FakeEngine, FakeSamplingParams, token_logprob


def text(name: str, *values: str) -> Tensor:
    data = np.empty(len(values), dtype=object)
    data[:] = [v.encode() for v in values]
    return Tensor(name, "BYTES", data)


def flag(name: str, value: bool) -> Tensor:
    return Tensor(name, "BOOL", np.array([value]))


def request(*tensors: Tensor, **parameters: object) -> InferenceRequest:
    return InferenceRequest({t.name: t for t in tensors}, id="req", parameters=dict(parameters))


def infer(engine: FakeEngine, req: InferenceRequest):  # type: ignore[no-untyped-def]
    return asyncio.run(vllm_contract.infer(engine, req, sampling_params=FakeSamplingParams))


def stream(engine: FakeEngine, req: InferenceRequest) -> list:
    async def collect() -> list:
        return [r async for r in vllm_contract.infer_stream(
            engine, req, sampling_params=FakeSamplingParams)]
    return asyncio.run(collect())


# -- generation ---------------------------------------------------------------------------------
def test_generate_prepends_the_prompt_unless_excluded() -> None:
    engine = FakeEngine()
    prompt = text("text_input", "Q: ")
    response = infer(engine, request(prompt, text("sampling_parameters", '{"max_tokens": 2}')))
    assert response.outputs[0].data.tolist() == [b"Q: Paris is"]
    assert response.final and response.id == "req"
    response = infer(engine, request(prompt, flag("exclude_input_in_output", True),
                                     text("sampling_parameters", '{"n": 2}')))
    assert response.outputs[0].data.tolist() == [b"Paris is the capital."] * 2
    assert engine.calls[-1][1] == {"n": 2}


def test_stream_yields_deltas_and_flags_the_last() -> None:
    responses = stream(FakeEngine(), request(text("text_input", "Q"), flag("stream", True),
                                             max_tokens=3))
    assert [r.outputs[0].data.tolist() for r in responses] == [[b"Paris"], [b" is"], [b" the"]]
    assert [r.final for r in responses] == [False, False, True]


def test_stream_requires_a_streaming_call() -> None:
    with pytest.raises(InvalidArgument, match="generate_stream"):
        infer(FakeEngine(), request(text("text_input", "Q"), flag("stream", True)))


def test_non_streaming_request_on_a_stream_answers_once() -> None:
    responses = stream(FakeEngine(), request(text("text_input", "Q"), max_tokens=1))
    assert [(r.outputs[0].data.tolist(), r.final) for r in responses] == [([b"QParis"], True)]


# -- scoring ------------------------------------------------------------------------------------
def expected_logprobs(engine: FakeEngine, context: str, candidate: str) -> list[float]:
    ids = engine.tokenizer.encode(context) + engine.tokenizer.encode(candidate,
                                                                      add_special_tokens=False)
    start = len(engine.tokenizer.encode(context))
    return [token_logprob(pos, ids[pos]) for pos in range(start, len(ids))]


def test_scoring_returns_each_candidates_logprobs_from_prefill() -> None:
    engine = FakeEngine()
    context = "w1 w2 w3 w4 w5 w6 w7 w8 w9"
    candidates = ["yes", "no way", "maybe so then"]
    response = infer(engine, request(text("context", context), text("candidates", *candidates)))
    out = {t.name: t.data for t in response.outputs}
    assert out["num_tokens"].tolist() == [1, 2, 3]
    for i, candidate in enumerate(candidates):
        expected = expected_logprobs(engine, context, candidate)
        np.testing.assert_allclose(out["token_logprobs"][i, :len(expected)], expected, rtol=1e-6)
        np.testing.assert_allclose(out["logprob_sum"][i], sum(expected), rtol=1e-6)
        assert not out["token_logprobs"][i, len(expected):].any()  # zero padding
    # prefill only: one pass over the context scores every first token (and caches it) ...
    (prompt, first, _), *tails = engine.calls
    context_ids = engine.tokenizer.encode(context)
    assert prompt == {"prompt_token_ids": context_ids} and first["max_tokens"] == 1
    assert first["logprob_token_ids"] == sorted(
        {engine.tokenizer.encode(c, add_special_tokens=False)[0] for c in candidates})
    # ... then one pass per multi-token candidate for its tail, reading the cached context
    assert len(tails) == 2  # "yes" is one token: its first-token score is all it needs
    for _, params, _ in tails:
        assert params["max_tokens"] == 1 and params["prompt_logprobs"] == 0
        assert params["skip_reading_prefix_cache"] is False  # no candidate needed a 2nd pass


def test_scoring_recomputes_when_the_cache_covers_candidate_tokens() -> None:
    engine = FakeEngine()
    context, candidate = "a", "b c d e f g h i j"
    # the same candidate twice: the second finds its own tokens cached, without logprobs
    response = infer(engine, request(text("context", context),
                                     text("candidates", candidate, candidate)))
    sums = response.outputs[0].data
    expected = sum(expected_logprobs(engine, context, candidate))
    np.testing.assert_allclose(sums, [expected, expected], rtol=1e-6)
    tails = [c[1] for c in engine.calls if "prompt_logprobs" in c[1]]
    assert [p["skip_reading_prefix_cache"] for p in tails] == [False, False, True]


@pytest.mark.parametrize(("tensors", "words"), [
    ([text("context", "c")], ["'candidates' is missing"]),
    ([text("context", "c"), text("candidates")], ["'candidates' is empty"]),
    ([text("context", "c"), text("candidates", "   ")], ["has no tokens"]),
    ([text("context", "c"), text("candidates", "x"), text("text_input", "t")],
     ["'text_input' is for generation"]),
    ([text("context", "c"), text("candidates", "x"), text("sampling_parameters", "{}")],
     ["no sampling parameters"]),
], ids=["no-candidates", "empty-candidates", "blank-candidate", "mixed-with-generation",
        "with-sampling-parameters"])
def test_bad_scoring_requests(tensors: list[Tensor], words: list[str]) -> None:
    with pytest.raises(InvalidArgument) as err:
        infer(FakeEngine(), request(*tensors))
    for word in words:
        assert word in err.value.message
