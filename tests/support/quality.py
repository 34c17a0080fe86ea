"""How close a lower-precision LLM is to bf16, measured over an OpenAI endpoint: the mean
log-likelihood per token of a fixed prompt set (vLLM's prompt logprobs) and greedy
continuations compared token by token. Shared by bench/precision.py and its CI test."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

PROMPTS = (
    "The capital of France is Paris, and the capital of Germany is Berlin.",
    "To make a cup of tea, boil the water, put a tea bag in a cup and pour the water over it.",
    "Photosynthesis is the process by which green plants use sunlight to make their food.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm sofa.",
    "Water freezes at zero degrees Celsius and boils at one hundred degrees at sea level.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "The three primary colours of light are red, green and blue; mixed, they make white.",
)
"""Fixed prompts, plain text (no chat template), scored and continued by every precision."""


@dataclass(frozen=True)
class Scored:
    """One model's answers to PROMPTS."""

    logprobs: list[list[float]]
    """Per prompt, the log-probability of each prompt token after the first."""
    continuations: list[list[int]]
    """Per prompt, the greedy continuation's token ids."""

    @property
    def mean_loglik(self) -> float:
        values = [v for row in self.logprobs for v in row]
        return sum(values) / len(values)


@dataclass(frozen=True)
class Closeness:
    """A model's answers against the bf16 reference's."""

    loglik_delta: float
    """Mean log-likelihood per token minus bf16's (nats; negative: worse)."""
    mean_abs_token_delta: float
    """Mean |logprob - bf16 logprob| over the same prompt tokens (nats)."""
    exact_match: float
    """Share of prompts whose greedy continuation equals bf16's token for token."""
    mean_common_prefix: float
    """Mean count of leading continuation tokens equal to bf16's."""


def score(base_url: str, model: str, *, max_tokens: int = 24,
          headers: dict[str, str] | None = None, prompts: tuple[str, ...] = PROMPTS,
          timeout_s: float = 300) -> Scored:
    """Prompt logprobs and a greedy continuation for each prompt, one request each."""
    logprobs, continuations = [], []
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s) as client:
        for prompt in prompts:
            response = client.post("/completions", json={
                "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "prompt_logprobs": 0, "return_token_ids": True, "ignore_eos": True})
            response.raise_for_status()
            choice = response.json()["choices"][0]
            ids, entries = choice["prompt_token_ids"], choice["prompt_logprobs"]
            logprobs.append([entry[str(token)]["logprob"]
                             for token, entry in zip(ids[1:], entries[1:], strict=True)])
            continuations.append(list(choice["token_ids"]))
    return Scored(logprobs, continuations)


def closeness(candidate: Scored, reference: Scored) -> Closeness:
    """How far `candidate` is from `reference` (bf16) on the same prompts."""
    deltas = [abs(a - b) for row, ref in zip(candidate.logprobs, reference.logprobs, strict=True)
              for a, b in zip(row, ref, strict=True)]
    prefixes = [_common_prefix(a, b)
                for a, b in zip(candidate.continuations, reference.continuations, strict=True)]
    exact = [a == b for a, b in zip(candidate.continuations, reference.continuations,
                                    strict=True)]
    return Closeness(
        loglik_delta=candidate.mean_loglik - reference.mean_loglik,
        mean_abs_token_delta=sum(deltas) / len(deltas),
        exact_match=sum(exact) / len(exact),
        mean_common_prefix=sum(prefixes) / len(prefixes))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
