"""What tests/constraints/test_engine.py and test_import.py ask of vLLM's `LLM` with Podium's
constraint processors: each scenario's requests (constraint specs, prompts, token budgets) and
the engine they run on, configured so that both traps occur: prompts longer than
``max_num_batched_tokens`` are prefilled in chunks, and a KV cache of a few blocks under many
concurrent requests forces preemptions. `tests/support/constrained_llm.py` runs them all in
one script (one engine start); the tests check what it wrote. Imports neither vLLM nor numba.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any

from tests.support.catalog import make_titles

# per built-in: the KV cache holds a fraction of them at once, so requests keep joining and
# leaving the batch (and their rows move) for the whole run
NUM_REQUESTS = int(os.environ.get("PODIUM_CONSTRAINT_ENGINE_REQUESTS", "32"))
NUM_PREEMPTED = 16  # outputs of ~60 tokens: 16 of them need three times the KV cache
MAX_BATCHED_TOKENS = 32
BLOCK_SIZE = 32
NUM_BLOCKS = 16  # 512 tokens of KV for up to 32 concurrent requests of ~100 tokens each
COLOURS = ["red", "green", "blue"]
ENGINE_ARGS: dict[str, Any] = {
    "enforce_eager": True,
    "max_model_len": BLOCK_SIZE * (NUM_BLOCKS - 1),  # one block is reserved
    "block_size": BLOCK_SIZE,
    "num_gpu_blocks_override": NUM_BLOCKS,
    "enable_chunked_prefill": True,
    "max_num_batched_tokens": MAX_BATCHED_TOKENS,
    "max_num_seqs": 32,
    "disable_log_stats": False,  # vllm:num_preemptions
    "seed": 0,
}


@dataclass(frozen=True)
class Scenario:
    """One batch of chat requests: spec, budget and temperature per request. `precompiled`:
    the spec is compiled before the request, as admission does (its key in the xargs); else
    only the spec goes in the xargs, as a user's own script passes it."""

    specs: list[dict[str, Any]]
    prompts: list[str]
    budgets: list[int]
    temperature: float = 1.0
    precompiled: bool = True
    long_prompts: bool = True  # every prompt longer than one scheduler step (prefilled in chunks)
    extra: dict[str, Any] = field(default_factory=dict)


def _prompts(task: str) -> list[str]:
    return [f"{task} (request {i}; answer in one line, nothing else)"
            for i in range(NUM_REQUESTS)]


def _same(spec: dict[str, Any], prompts: list[str], budget: int) -> Scenario:
    return Scenario([spec] * len(prompts), prompts, [budget] * len(prompts))


PATTERN = r"[A-Z]{2}-[0-9]{3,5}( \([a-z]+\))?"


def member_specs(n: int) -> list[dict[str, Any]]:
    """``n`` different specs, as members bring them: each its own candidates from one
    catalog, the three built-in types in turn."""
    rng = random.Random(64)
    catalog = make_titles(5000)
    specs: list[dict[str, Any]] = []
    for i in range(n):
        if i % 3 == 0:
            specs.append({"type": "choice", "choices": rng.sample(catalog, rng.randint(20, 200))})
        elif i % 3 == 1:
            specs.append({"type": "distinct_items", "items": rng.sample(catalog,
                                                                         rng.randint(20, 100)),
                          "min": 3, "max": 4})
        else:
            specs.append({"type": "regex", "pattern": rf"[A-Z]{{2}}-{i:02d}[0-9]{{2,4}}"})
    return specs


def scenarios() -> dict[str, Scenario]:
    members = member_specs(64)
    return {
        "choice": _same({"type": "choice", "choices": make_titles(2000)},
                        _prompts("Recommend one movie title for a rainy evening"), 40),
        "distinct_items": _same({"type": "distinct_items", "items": make_titles(300),
                                 "min": 2, "max": 3},
                                _prompts("List two or three movie titles as a JSON array"), 80),
        # long arrays outgrow the few KV blocks: the scheduler preempts and later resumes
        "preemption": _same({"type": "distinct_items", "items": make_titles(500),
                             "min": 6, "max": 6},
                            _prompts("List exactly six movie titles as a JSON array")
                            [:NUM_PREEMPTED], 120),
        "regex": _same({"type": "regex", "pattern": PATTERN},
                       _prompts("Give a ticket ID like AB-1234"), 24),
        "members": Scenario(
            members,
            [f"Answer for member {i}: pick what fits them best, in one line, nothing else"
             for i in range(64)],
            [{"choice": 40, "distinct_items": 100, "regex": 24}[s["type"]] for s in members]),
        # what test_import.py's user script sends: the spec alone in the xargs
        "colours": Scenario([{"type": "choice", "choices": COLOURS}] * 4,
                            ["Name a colour."] * 4, [8] * 4, precompiled=False,
                            long_prompts=False),
    }


MIXED_PROMPT = "Say hello to the world in a long sentence."
"""The unconstrained-beside-constrained case (its own shape, run by the script): one free
greedy request beside a constrained one, then the free one alone; the free one's tokens must
be the same both times."""
