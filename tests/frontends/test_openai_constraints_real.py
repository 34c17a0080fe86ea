"""Constraints as a client uses them: the official `openai` SDK against the shared real instance.

For every built-in, 32 sampled requests at temperature 1.0 go through the whole serving path
(``extra_body`` → admission → the engine's batch processor) 16 at a time, so the second half
joins a batch whose first half is still decoding, and every answer must satisfy its constraint.
The engine-level traps (chunked prefill, preemption) and the larger samples are in
``tests/constraints/test_engine.py``.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import regex

from tests.conftest import API_KEY, CATALOG_SIZE, LLM
from tests.support.catalog import make_titles

pytestmark = pytest.mark.engine

REQUESTS = 32  # sampled requests per built-in: two batches' worth
CONCURRENCY = 16


def _sample(client: openai.OpenAI, constraint: dict[str, Any], task: str,
            max_tokens: int) -> list[Any]:
    """``REQUESTS`` chat completions, each its own prompt, all with ``constraint``."""

    def one(i: int) -> Any:
        r = client.chat.completions.create(
            model=LLM, max_tokens=max_tokens, temperature=1.0,
            messages=[{"role": "user", "content": f"{task} (request {i}; one line only)"}],
            extra_body={"constraint": constraint})
        assert len(r.choices) == 1
        return r.choices[0]

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(one, range(REQUESTS)))


def test_choice_every_answer_is_a_catalog_title(openai_client: openai.OpenAI) -> None:
    titles = make_titles(2000)
    answers = _sample(openai_client, {"type": "choice", "choices": titles},
                      "Recommend one movie title for a rainy evening", 40)
    outside = [a.message.content for a in answers if a.message.content not in set(titles)]
    assert not outside, f"{len(outside)} answers outside the catalog: {outside[:3]}"
    assert all(a.finish_reason == "stop" for a in answers)


def test_distinct_items_every_answer_is_a_valid_array(openai_client: openai.OpenAI) -> None:
    items = make_titles(300)
    answers = _sample(openai_client,
                      {"type": "distinct_items", "items": items, "min": 2, "max": 3},
                      "List two or three movie titles as a JSON array", 80)
    for a in answers:
        assert a.finish_reason == "stop", a.message.content
        value = json.loads(a.message.content)
        assert 2 <= len(value) <= 3 and len(set(value)) == len(value), value
        assert set(value) <= set(items), value


def test_regex_every_answer_matches(openai_client: openai.OpenAI) -> None:
    pattern = r"[A-Z]{2}-[0-9]{3,5}( \([a-z]+\))?"
    answers = _sample(openai_client, {"type": "regex", "pattern": pattern},
                      "Give a ticket ID like AB-1234", 24)
    for a in answers:
        text = a.message.content
        if a.finish_reason == "stop":
            assert re.fullmatch(pattern, text), text
        else:
            # cut by max_tokens: what was produced is a prefix of the language (or a whole
            # word of it, when the budget ran out on its last character, before EOS)
            assert a.finish_reason == "length", a.finish_reason
            assert regex.fullmatch(pattern, text, partial=True), text
    assert sum(a.finish_reason == "stop" for a in answers) >= REQUESTS // 2


def test_constraints_combine_with_sampling_options(openai_client: openai.OpenAI) -> None:
    titles = make_titles(500)
    choice = {"type": "choice", "choices": titles}

    def ask(**options: Any) -> Any:
        return openai_client.chat.completions.create(
            model=LLM, messages=[{"role": "user", "content": "Recommend a film."}],
            max_tokens=40, extra_body={"constraint": options.pop("constraint", choice)},
            **options)

    # temperature, top_p, n and seed: every sample complies, and a seed repeats its samples.
    # The prompt is sent once first: the engine's numerics differ slightly between a prompt
    # prefilled afresh and one read from the prefix cache (the first request's first sample
    # prefilled it, its siblings and every later request read it), and at a near-tie ("The Last
    # Kingdom" or "... Returns") that changed the first sample of the first request only.
    ask(temperature=0.9, top_p=0.8, n=1, seed=7)
    first = ask(temperature=0.9, top_p=0.8, n=3, seed=42)
    assert len(first.choices) == 3
    assert all(c.message.content in titles for c in first.choices)
    again = ask(temperature=0.9, top_p=0.8, n=3, seed=42)
    assert [c.message.content for c in again.choices] == \
        [c.message.content for c in first.choices]
    # stop: the stop string cuts a constrained output like any other (no title holds ", ";
    # with min 2 the separator must follow the first item)
    assert not any(", " in t for t in titles)
    items = {"type": "distinct_items", "items": titles, "min": 2, "max": 3}
    cut = ask(constraint=items, temperature=1.0, stop=[", "])
    assert cut.choices[0].finish_reason == "stop"
    [item] = json.loads(cut.choices[0].message.content + "]")  # the array up to the 1st item
    assert item in titles


BAD_CONSTRAINTS = [
    pytest.param({"type": "frob"}, "unknown constraint type 'frob'", id="unknown-type"),
    pytest.param({"type": "choice", "choices": []}, "choices is empty", id="empty-choices"),
    pytest.param({"type": "distinct_items", "items": [], "min": 1, "max": 2}, "items is empty",
                 id="empty-candidates"),
    pytest.param({"type": "distinct_items", "items": ["a", "b"], "min": 2, "max": 1},
                 "min=2", id="min-over-max"),
    pytest.param({"type": "regex", "pattern": "[a-"}, "invalid regex", id="invalid-regex"),
]


@pytest.mark.parametrize(("constraint", "needle"), BAD_CONSTRAINTS)
def test_bad_constraint_is_a_400_on_both_protocols_then_good(instance, constraint: Any,
                                                             needle: str) -> None:
    headers = instance.headers()
    chat = {"model": LLM, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(f"{instance.openai_url}/chat/completions", headers=headers, timeout=60,
                   json={**chat, "constraint": constraint})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    # KServe v2 /generate: the constraint is a request parameter
    generate = f"{instance.http_url}/v2/models/{LLM}/generate"
    r = httpx.post(generate, headers=headers, timeout=60, json={
        "text_input": "Hi", "parameters": {"max_tokens": 4, "constraint": constraint}})
    assert r.status_code == 400 and needle in r.json()["error"], r.text
    # the server keeps serving, constrained requests included
    good = {"type": "choice", "choices": ["yes", "no"]}
    r = httpx.post(f"{instance.openai_url}/chat/completions", headers=headers, timeout=60,
                   json={**chat, "constraint": good})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    r = httpx.post(generate, headers=headers, timeout=60, json={
        "text_input": "Hi", "parameters": {"max_tokens": 4, "constraint": good}})
    # /generate answers prompt + output, as Triton's vLLM backend does by default
    assert r.status_code == 200 and r.json()["text_output"] in ("Hiyes", "Hino"), r.text


def test_constraint_as_a_grpc_request_parameter(instance) -> None:
    """gRPC parameters carry scalars only: the constraint travels as JSON text."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(instance.grpc_url)
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Is the sky blue?"], dtype=object))
    metadata = {k.lower(): v for k, v in instance.headers().items()}  # gRPC: lowercase keys
    result = client.infer(LLM, [text], headers=metadata, parameters={
        "max_tokens": 4, "temperature": 1.0,
        "constraint": json.dumps({"type": "choice", "choices": [" yes", " no"]})})
    assert result.as_numpy("text_output")[0].decode() in ("Is the sky blue? yes",
                                                          "Is the sky blue? no")


def _metric(instance, name: str, *labels: str) -> float:
    """The sum of the instance's samples of `name` whose labels include all of `labels`."""
    text = httpx.get(f"{instance.http_url}/metrics", timeout=30,
                     headers={"authorization": f"Bearer {API_KEY}"}).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(label in line for label in labels))


def _pick(client: openai.OpenAI, items: list[str]) -> list[str]:
    r = client.chat.completions.create(
        model=LLM, max_tokens=60, temperature=1.0,
        messages=[{"role": "user", "content": "Two or three titles as a JSON array"}],
        extra_body={"constraint": {"type": "distinct_items", "items": items, "min": 2,
                                   "max": 3}})
    value = json.loads(r.choices[0].message.content)
    assert 2 <= len(value) <= 3 and set(value) <= set(items), value
    return value


def test_the_served_instance_compiles_in_a_worker_ready_with_its_catalog(
        instance, openai_client: openai.OpenAI) -> None:
    """The package names a constraint catalog, so `podium serve` starts its compile worker at
    boot and the worker tokenizes the catalog before the instance is ready: a new spec over
    catalog titles is compiled in the worker at once and tokenizes none of its titles; one
    over titles outside it tokenizes exactly those."""
    compiled = 'podium:constraint_compile_seconds_count', 'compiler="process"', 'cache="miss"'
    work = "podium:constraint_compile_work_seconds_count", 'compiler="process"'
    tokenized = "podium:constraint_strings_tokenized_total", 'type="distinct_items"'
    titles = make_titles(CATALOG_SIZE)
    in_worker, strings = _metric(instance, *compiled), _metric(instance, *tokenized)
    worked = _metric(instance, *work)
    _pick(openai_client, random.sample(titles, 50))  # a spec never sent before: a compile
    assert _metric(instance, *compiled) == in_worker + 1, "not compiled in the worker"
    assert _metric(instance, *work) == worked + 1
    assert _metric(instance, *tokenized) == strings, "catalog titles were tokenized again"
    outside = [f"Unlisted {uuid.uuid4().hex[:8]} Story" for _ in range(17)]
    _pick(openai_client, titles[5:25] + outside)
    assert _metric(instance, *compiled) == in_worker + 2
    assert _metric(instance, *tokenized) == strings + len(outside)
