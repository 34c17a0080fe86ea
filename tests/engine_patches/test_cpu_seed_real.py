"""Seeded requests on the real engine with vLLM's default scheduling (chunked prefill on).

The shared instance serves the default package with a prefill chunk of
``MAX_NUM_BATCHED_TOKENS`` tokens a step (tests/conftest.py), so a prompt just over it is
prefilled in two chunks: the case that killed vLLM 0.32's CPU engine before Podium's plugin.
The chunk's size does not matter to the bug; its tokens do to a CPU's time, so the prompt is
only a few dozen tokens longer than one chunk."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import LLM, MAX_NUM_BATCHED_TOKENS

pytestmark = pytest.mark.engine
LONG = " ".join(f"item{i}" for i in range(MAX_NUM_BATCHED_TOKENS // 3 + 10))  # ~3 tokens each


def test_seeded_request_prefilled_in_chunks_is_served_and_repeatable(
        openai_client: openai.OpenAI) -> None:
    def sample() -> tuple[str, int]:
        r = openai_client.completions.create(model=LLM, prompt=LONG + "\nNext:", max_tokens=12,
                                             temperature=1.0, seed=4321)
        return r.choices[0].text, r.usage.prompt_tokens

    first, prompt_tokens = sample()
    assert prompt_tokens > MAX_NUM_BATCHED_TOKENS, "the prompt must span more than one chunk"
    # the second is read mostly from the prefix cache and prefilled in one chunk: a seed's
    # output must not depend on how its prompt was chunked
    assert sample()[0] == first
    # the engine is alive and serving: an unseeded request right after
    r = openai_client.completions.create(model=LLM, prompt="Hello", max_tokens=4)
    assert r.choices[0].text
