"""/tokenize, /detokenize and /invocations on the real engine (the shared instance), checked
against the model's own tokenizer and chat template (what `vllm serve` answers: its
ServingTokenization renders with the same tokenizer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import API_KEY, EMBEDDER, LLM
from tests.support.harness import RunningInstance

pytestmark = pytest.mark.engine
PROMPT = "Podium serves models, tokenized the same way everywhere."
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def _post(instance: RunningInstance, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(instance.http_url + path, json=body, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"})


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tokenize_a_prompt_as_the_models_tokenizer(instance: RunningInstance, tokenizer: Any,
                                                   add_special_tokens: bool) -> None:
    r = _post(instance, "/tokenize", {"model": LLM, "prompt": PROMPT, "return_token_strs": True,
                                      "add_special_tokens": add_special_tokens})
    assert r.status_code == 200, r.text
    answer = r.json()
    expected = tokenizer.encode(PROMPT, add_special_tokens=add_special_tokens)
    assert answer["tokens"] == expected
    assert answer["count"] == len(expected)
    assert answer["token_strs"] == tokenizer.convert_ids_to_tokens(expected)
    assert answer["max_model_len"] > len(expected)


def test_tokenize_messages_as_the_chat_template_renders_them(instance: RunningInstance,
                                                             tokenizer: Any) -> None:
    r = _post(instance, "/tokenize", {"model": LLM, "messages": MESSAGES})
    assert r.status_code == 200, r.text
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False,
                                             add_generation_prompt=True)
    expected = tokenizer.encode(rendered, add_special_tokens=False)
    assert r.json()["tokens"] == expected
    assert r.json()["token_strs"] is None  # not asked for


def test_detokenize_round_trips(instance: RunningInstance, tokenizer: Any) -> None:
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    r = _post(instance, "/detokenize", {"model": LLM, "tokens": ids})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": PROMPT}


def test_tokenize_without_model_names_model_when_two_are_served(
        instance: RunningInstance) -> None:
    r = _post(instance, "/tokenize", {"prompt": PROMPT})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "model" and LLM in error["message"] and EMBEDDER in error["message"]


def test_tokenize_needs_the_api_key(instance: RunningInstance) -> None:
    r = httpx.post(instance.http_url + "/tokenize", json={"model": LLM, "prompt": "x"},
                   timeout=30)
    assert r.status_code == 401, r.text


def test_invocations_dispatches_by_the_bodys_shape(instance: RunningInstance) -> None:
    chat = _post(instance, "/invocations", {"model": LLM, "messages": MESSAGES,
                                            "max_tokens": 4, "temperature": 0})
    assert chat.status_code == 200, chat.text
    assert chat.json()["object"] == "chat.completion"
    completion = _post(instance, "/invocations", {"model": LLM, "prompt": PROMPT,
                                                  "max_tokens": 4, "temperature": 0})
    assert completion.status_code == 200, completion.text
    assert completion.json()["object"] == "text_completion"
    embedding = _post(instance, "/invocations", {"model": EMBEDDER, "input": PROMPT})
    assert embedding.status_code == 200, embedding.text
    assert embedding.json()["data"][0]["object"] == "embedding"
    metrics = httpx.get(instance.http_url + "/metrics", timeout=30).text
    assert 'endpoint="/invocations"' in metrics
