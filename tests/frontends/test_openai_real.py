"""The OpenAI API on the real engine (SmolLM2 on vLLM), driven by the official `openai` SDK."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import API_KEY, EMBEDDER, LLM

pytestmark = pytest.mark.engine
USER = [{"role": "user", "content": "Name a colour."}]


def test_models_lists_both_real_models(openai_client: openai.OpenAI) -> None:
    ids = {m.id for m in openai_client.models.list().data}
    assert ids == {LLM, EMBEDDER}


def test_chat_with_sampling_options(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.create(
        model=LLM, messages=USER, max_tokens=8, n=2, temperature=0.8, seed=7,
        logprobs=True, top_logprobs=3)
    assert len(r.choices) == 2
    for choice in r.choices:
        assert choice.finish_reason in ("stop", "length")
        tokens = choice.logprobs.content
        assert 0 < len(tokens) <= 8
        assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in tokens)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)


def test_seed_makes_sampling_repeatable(openai_client: openai.OpenAI) -> None:
    def sample() -> str:
        r = openai_client.chat.completions.create(model=LLM, messages=USER, max_tokens=12,
                                                  temperature=1.0, seed=1234)
        return r.choices[0].message.content

    assert sample() == sample()


def test_stop_sequence_ends_generation(openai_client: openai.OpenAI) -> None:
    r = openai_client.completions.create(model=LLM, prompt="1, 2, 3, 4,", max_tokens=30,
                                         temperature=0, stop=["7"])
    assert "7" not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"


def test_chat_streaming_with_usage(openai_client: openai.OpenAI) -> None:
    stream = openai_client.chat.completions.create(
        model=LLM, messages=USER, max_tokens=10, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 10


def test_completions_streaming(openai_client: openai.OpenAI) -> None:
    stream = openai_client.completions.create(model=LLM, prompt="Once upon a time",
                                              max_tokens=6, stream=True, temperature=0)
    pieces = [c.choices[0].text for c in stream if c.choices]
    assert len(pieces) >= 2 and "".join(pieces)


def test_json_schema_is_enforced_in_every_sample(openai_client: openai.OpenAI) -> None:
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    r = openai_client.chat.completions.create(
        model=LLM, messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=60, temperature=0.9, n=10, seed=3,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema}})
    assert len(r.choices) == 10
    for choice in r.choices:
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_mode_returns_json(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.create(
        model=LLM, messages=[
            {"role": "system", "content": "Reply with one small JSON object."},
            {"role": "user", "content": 'Give me a JSON object with a "name" for a cat.'}],
        max_tokens=100, temperature=0.7, seed=2, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_embeddings_from_the_real_embedding_model(openai_client: openai.OpenAI) -> None:
    r = openai_client.embeddings.create(model=EMBEDDER,
                                        input=["a cat sits", "a cat is sitting", "stock prices"])
    vectors = [d.embedding for d in r.data]
    assert all(len(v) == 384 for v in vectors)
    norms = [sum(x * x for x in v) ** 0.5 for v in vectors]
    assert all(abs(n - 1) < 1e-3 for n in norms)

    def cos(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cos(vectors[0], vectors[1]) > cos(vectors[0], vectors[2]) + 0.2


def test_wrong_endpoint_for_model_kind(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding"):
        openai_client.chat.completions.create(model=EMBEDDER, messages=USER, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        openai_client.embeddings.create(model=LLM, input="x")


GOOD = {"model": LLM, "messages": USER, "max_tokens": 4}
BAD = [
    pytest.param(b"{oops", 400, "not valid JSON", id="non-json"),
    pytest.param(b"[1, 2]", 400, "JSON object", id="list-body"),
    pytest.param(b"null", 400, "JSON object", id="null-body"),
    pytest.param({**GOOD, "messages": []}, 400, "", id="empty-messages"),
    pytest.param({**GOOD, "messages": "hi"}, 400, "messages", id="messages-not-list"),
    pytest.param({**GOOD, "max_tokens": "many"}, 400, "max_tokens", id="max-tokens-type"),
    pytest.param({**GOOD, "temperature": -0.5}, 400, "temperature", id="negative-temperature"),
    pytest.param({**GOOD, "top_p": 1.5}, 400, "top_p", id="top-p-range"),
    pytest.param({**GOOD, "n": 0}, 400, "n", id="n-zero"),
    pytest.param({**GOOD, "top_logprobs": -1, "logprobs": True}, 400, "top_logprobs",
                 id="negative-top-logprobs"),
    pytest.param({**GOOD, "max_tokens": 100_000}, 400, "max_tokens", id="max-tokens-past-context"),
    pytest.param({**GOOD, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "required": "name"}}}}, 400, "JSON Schema",
        id="invalid-json-schema"),
    pytest.param({**GOOD, "store": True}, 400, "store", id="unhonoured-field"),
    pytest.param({**GOOD, "model": "gpt-4"}, 404, "gpt-4", id="unknown-model"),
    pytest.param({**GOOD, "pad": "x" * (17 * 1024 * 1024)}, 413, "limit", id="oversized-body"),
]


@pytest.mark.parametrize(("body", "status", "needle"), BAD)
def test_bad_input_then_good_request(instance, body, status: int, needle: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**instance.headers(), "content-type": "application/json"}
    r = httpx.post(f"{instance.openai_url}/chat/completions", content=content,
                   headers=headers, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"] or needle == error.get("param")
    good = httpx.post(f"{instance.openai_url}/chat/completions", json=GOOD,
                      headers=instance.headers(), timeout=60)
    assert good.status_code == 200, good.text


def test_api_key_is_required(instance) -> None:
    assert httpx.get(f"{instance.http_url}/health").status_code == 200
    wrong = openai.OpenAI(base_url=instance.openai_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    r = httpx.get(f"{instance.http_url}/health/ready")
    assert r.status_code == 401
    r = httpx.get(f"{instance.http_url}/health/ready",
                  headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200


def _running_requests(instance) -> float:
    text = httpx.get(f"{instance.http_url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running") and f'model_name="{LLM}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_client_disconnect_aborts_generation(instance) -> None:
    body = {**GOOD, "max_tokens": 4000, "stream": True, "temperature": 1.0,
            "messages": [{"role": "user", "content": "Write a very long story."}],
            "ignore_eos": True}
    with httpx.stream("POST", f"{instance.openai_url}/chat/completions", json=body,
                      headers=instance.headers(), timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert _running_requests(instance) >= 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running_requests(instance) > 0:
        time.sleep(0.2)
    assert _running_requests(instance) == 0, "the engine kept generating for a gone client"


def test_one_metrics_endpoint_with_server_and_engine_metrics(instance) -> None:
    r = httpx.post(f"{instance.openai_url}/chat/completions", json=GOOD,
                   headers={**instance.headers(), "X-Request-Id": "trace-42"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42"
    text = httpx.get(f"{instance.http_url}/metrics", timeout=10).text  # open: --metrics-open
    served = [line for line in text.splitlines() if line.startswith("podium:requests_total{")
              and 'protocol="openai"' in line and f'model="{LLM}"' in line
              and 'code="200"' in line]
    assert served and float(served[0].rsplit(" ", 1)[1]) >= 1
    assert "podium:ready 1.0" in text
    for family in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                   "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket"):
        assert any(line.startswith(family) and f'model_name="{LLM}"' in line
                   for line in text.splitlines()), family


def test_constraint_choice_over_openai(openai_client: openai.OpenAI) -> None:
    titles = ["The Long Night", "Blue Harbor", "A Quiet Storm", "Paper Moons"]
    r = openai_client.chat.completions.create(
        model=LLM, messages=[{"role": "user", "content": "Recommend a film title."}],
        max_tokens=20, temperature=1.0, n=4, seed=11,
        extra_body={"constraint": {"type": "choice", "choices": titles}})
    for choice in r.choices:
        assert choice.message.content in titles
        assert choice.finish_reason == "stop"


def test_invalid_constraint_is_a_400_then_good(instance) -> None:
    bad = {**GOOD, "constraint": {"type": "distinct_items", "items": ["a", "b"], "min": 3,
                                  "max": 2}}
    r = httpx.post(f"{instance.openai_url}/chat/completions", json=bad,
                   headers=instance.headers(), timeout=60)
    assert r.status_code == 400 and "min" in r.json()["error"]["message"]
    good = httpx.post(f"{instance.openai_url}/chat/completions", json=GOOD,
                      headers=instance.headers(), timeout=60)
    assert good.status_code == 200


def test_stream_without_usage_is_logged_with_token_counts(instance) -> None:
    """The client did not ask for usage: it gets none, but the request log still counts."""
    body = {**GOOD, "stream": True, "max_tokens": 6, "temperature": 0}
    headers = {**instance.headers(), "X-Request-Id": "stream-usage-1"}
    with httpx.stream("POST", f"{instance.openai_url}/chat/completions", json=body,
                      headers=headers, timeout=60) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines()
                  if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks and all(c.get("usage") is None for c in chunks)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [ln for ln in instance.log().splitlines() if "stream-usage-1 " in ln]
        if lines:
            break
        time.sleep(0.2)
    assert lines, "no request log line for the streamed request"
    prompt, completion = lines[-1].rsplit(" ", 1)[1].removesuffix("tok").split("+")
    assert int(prompt) > 0 and 0 < int(completion) <= 6
