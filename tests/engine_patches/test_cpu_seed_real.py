"""Seeded requests on the real engine with vLLM's default scheduling (chunked prefill on).

The shared instance serves the default package, whose prefill budget is vLLM's CPU default
(2,048 tokens a step), so a prompt of ~2,500 tokens is prefilled in two chunks: the case that
killed vLLM 0.32's CPU engine before Podium's plugin."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import LLM

pytestmark = pytest.mark.engine
LONG = " ".join(f"item{i}" for i in range(600))  # ~2,500 tokens


def test_seeded_request_prefilled_in_chunks_is_served_and_repeatable(
        openai_client: openai.OpenAI) -> None:
    def sample() -> tuple[str, int]:
        r = openai_client.completions.create(model=LLM, prompt=LONG + "\nNext:", max_tokens=12,
                                             temperature=1.0, seed=4321)
        return r.choices[0].text, r.usage.prompt_tokens

    first, prompt_tokens = sample()
    assert prompt_tokens > 2048, "the prompt must span more than one prefill chunk"
    assert sample()[0] == first
    # the engine is alive and serving: an unseeded request right after
    r = openai_client.completions.create(model=LLM, prompt="Hello", max_tokens=4)
    assert r.choices[0].text
