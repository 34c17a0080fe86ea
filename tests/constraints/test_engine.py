"""Real engine: vLLM runs SmolLM2 with the processor; every output must comply.

One engine for these tests and test_import.py's (the session's `constrained_run`,
tests/constraints/conftest.py): vLLM's `LLM` in a script that runs every scenario of
tests/support/constrained_scenarios.py, configured so that both traps occur: prompts longer
than ``max_num_batched_tokens`` are prefilled in chunks, and a KV cache of a few blocks under
many concurrent requests forces preemptions (asserted through ``vllm:num_preemptions``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import regex

from tests.support.constrained_scenarios import MAX_BATCHED_TOKENS, PATTERN, scenarios

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]  # the first test waits the run


def _outputs(run: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The scenario's outputs; every prompt was longer than one scheduler step, so each was
    prefilled in chunks."""
    result = run[name]
    assert "error" not in result, result.get("error")
    outs = result["outputs"]
    assert len(outs) == len(scenarios()[name].prompts)
    assert min(o["prompt_len"] for o in outs) > MAX_BATCHED_TOKENS
    return outs


def test_choice_all_outputs_are_one_title(constrained_run: dict) -> None:
    titles = set(scenarios()["choice"].specs[0]["choices"])
    outs = _outputs(constrained_run, "choice")
    bad = [o["text"] for o in outs if o["text"] not in titles]
    assert not bad, f"{len(bad)} outputs outside the catalog: {bad[:3]}"
    assert all(o["finish_reason"] == "stop" for o in outs)


def test_distinct_items_all_outputs_are_valid_arrays(constrained_run: dict) -> None:
    items = set(scenarios()["distinct_items"].specs[0]["items"])
    for o in _outputs(constrained_run, "distinct_items"):
        assert o["finish_reason"] == "stop", o["text"]
        value = json.loads(o["text"])
        assert 2 <= len(value) <= 3 and len(set(value)) == len(value), o["text"]
        assert set(value) <= items, o["text"]


def test_outputs_comply_through_preemption(constrained_run: dict) -> None:
    """Long arrays outgrow the few KV blocks: the scheduler preempts and later resumes
    requests, and each resumed request's state is rebuilt from its history."""
    items = set(scenarios()["preemption"].specs[0]["items"])
    outs = _outputs(constrained_run, "preemption")
    assert constrained_run["preemption"]["preempted"] > 0, \
        "the small KV cache should have forced preemption"
    for o in outs:
        assert o["finish_reason"] == "stop", o["text"]
        value = json.loads(o["text"])
        assert len(value) == 6 == len(set(value)) and set(value) <= items, o["text"]


def test_regex_all_outputs_match(constrained_run: dict) -> None:
    outs = _outputs(constrained_run, "regex")
    for o in outs:
        assert o["finish_reason"] in ("stop", "length"), o["text"]
        if o["finish_reason"] == "stop":
            assert re.fullmatch(PATTERN, o["text"]), o["text"]
        else:
            # cut by max_tokens: the text so far is a prefix of the language (or a whole word
            # of it, when the budget ran out on its last character, before EOS)
            assert regex.fullmatch(PATTERN, o["text"], partial=True), o["text"]
    assert sum(o["finish_reason"] == "stop" for o in outs) >= len(outs) // 2


def test_unconstrained_requests_in_the_same_batch_are_untouched(constrained_run: dict) -> None:
    result = constrained_run["mixed"]
    assert "error" not in result, result.get("error")
    (free, constrained), [alone] = result["outputs"], result["alone"]
    assert free["token_ids"] == alone["token_ids"]
    assert constrained["text"] in ("yes", "no")


def _complies(spec: dict[str, Any], out: dict[str, Any]) -> bool:
    text, stopped = out["text"], out["finish_reason"] == "stop"
    if spec["type"] == "choice":
        return stopped and text in spec["choices"]
    if spec["type"] == "distinct_items":
        value = json.loads(text) if stopped else None
        return (isinstance(value, list) and spec["min"] <= len(value) <= spec["max"]
                and len(set(value)) == len(value) and set(value) <= set(spec["items"]))
    if stopped:
        return re.fullmatch(spec["pattern"], text) is not None
    return regex.fullmatch(spec["pattern"], text, partial=True) is not None


def test_64_different_specs_in_one_batch_comply(constrained_run: dict) -> None:
    """Per-member specs: 64 requests, 64 different constraints, in one engine batch, under
    chunked prefill and preemption; every output complies with its own spec."""
    specs = scenarios()["members"].specs
    outs = _outputs(constrained_run, "members")
    assert constrained_run["members"]["preempted"] > 0, \
        "the small KV cache should have forced preemption"
    bad = [(s["type"], o["text"]) for s, o in zip(specs, outs, strict=True)
           if not _complies(s, o)]
    assert not bad, f"{len(bad)} of 64 outputs break their own spec: {bad[:3]}"
