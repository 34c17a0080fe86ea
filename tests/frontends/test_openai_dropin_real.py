"""`vllm serve`'s endpoints and fields on the real engine (the shared instance): the batch
chat endpoint, the fields Podium now honours (each with its effect), and the messages that say
as much as vLLM's. Each refusal is followed by a good request. Where the answer is
deterministic (temperature 0, token ids, the rendered template) it is compared with what the
same engine answers one request at a time, or with the model's own tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import API_KEY, LLM
from tests.support.harness import RunningInstance
from tests.support.polling import eventually

pytestmark = pytest.mark.engine
CONVERSATIONS = [[{"role": "user", "content": f"Count from {i} to {i + 3}."}] for i in range(3)]
GREEDY = {"temperature": 0, "max_tokens": 4}


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def _post(instance: RunningInstance, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(instance.http_url + path, json={"model": LLM, **body}, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}"})


def _good_chat(instance: RunningInstance) -> None:
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY})
    assert r.status_code == 200, r.text


def _refused(r: httpx.Response, field: str, *words: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] is not None and error["param"].startswith(field), error
    for word in words:
        assert word in error["message"], error


def test_batch_answers_each_conversation_as_chat_does(instance: RunningInstance) -> None:
    r = _post(instance, "/v1/chat/completions/batch", {"messages": CONVERSATIONS, **GREEDY})
    assert r.status_code == 200, r.text
    batch = r.json()
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2]
    prompt = completion = 0
    for conversation, choice in zip(CONVERSATIONS, batch["choices"], strict=True):
        single = _post(instance, "/v1/chat/completions",
                       {"messages": conversation, **GREEDY}).json()
        assert choice["message"]["content"] == single["choices"][0]["message"]["content"]
        prompt += single["usage"]["prompt_tokens"]
        completion += single["usage"]["completion_tokens"]
    assert batch["usage"]["prompt_tokens"] == prompt
    assert batch["usage"]["completion_tokens"] == completion


def test_batch_over_the_cap_is_refused_naming_it(instance: RunningInstance) -> None:
    r = _post(instance, "/v1/chat/completions/batch",
              {"messages": [CONVERSATIONS[0]] * 65, **GREEDY})
    _refused(r, "messages", "65 conversations", "limit of 64", "--max-batch-conversations")
    r = _post(instance, "/v1/chat/completions/batch", {"messages": CONVERSATIONS[:1], **GREEDY})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("extra", "field", "words"), [
    ({"n": 2}, "n", ("n > 1",)),
    ({"stream": True}, "stream", ("/v1/chat/completions",)),
    ({"length_penalty": 0.5}, "length_penalty", ("beam search",)),
    ({"messages": [[]]}, "messages", ("conversation 0", "empty")),
])
def test_batch_refusals_name_the_field(instance: RunningInstance, extra: dict[str, Any],
                                       field: str, words: tuple[str, ...]) -> None:
    r = _post(instance, "/v1/chat/completions/batch",
              {"messages": CONVERSATIONS[:1], **GREEDY, **extra})
    _refused(r, field, *words)
    assert _post(instance, "/v1/chat/completions/batch",
                 {"messages": CONVERSATIONS[:1], **GREEDY}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_logprob_token_ids_scores_the_tokens_asked_for(instance: RunningInstance, path: str,
                                                       stream: bool) -> None:
    wanted = [15, 16, 17]
    body: dict[str, Any] = {**GREEDY, "logprobs": True if "chat" in path else 1,
                            "logprob_token_ids": wanted, "return_tokens_as_token_ids": True,
                            "stream": stream}
    body.update({"messages": CONVERSATIONS[0]} if "chat" in path else {"prompt": "One, two,"})
    r = _post(instance, path, body)
    assert r.status_code == 200, r.text
    steps = []
    events = [json.loads(line.removeprefix("data: ")) for line in r.text.splitlines()
              if line.startswith("data: {")] if stream else [r.json()]
    for event in events:
        for choice in event["choices"]:
            logprobs = choice.get("logprobs") or {}
            if "chat" in path:
                steps += [[t["token"] for t in step["top_logprobs"]]
                          for step in logprobs.get("content") or []]
            else:
                steps += [list(step) for step in logprobs.get("top_logprobs") or []]
    assert steps
    for tokens in steps:
        assert {f"token_id:{i}" for i in wanted} <= set(tokens), tokens


def test_kv_transfer_params_reach_the_engine(instance: RunningInstance) -> None:
    """Without a KV connector vLLM still reads one key: `prompt_token_ids`, the prefill
    stage's ids a decode stage reuses instead of rendering the messages again."""
    other = [{"role": "user", "content": "A longer question, rendered once by the prefill "
                                         "stage, whose ids the decode stage reuses."}]
    ids = _post(instance, "/tokenize", {"messages": other}).json()["tokens"]
    plain = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY})
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY,
                                                 "kv_transfer_params": {"prompt_token_ids": ids}})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    assert plain.json()["usage"]["prompt_tokens"] != len(ids)
    assert "kv_transfer_params" in r.json()  # None: this engine runs no KV connector
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY,
                                                 "kv_transfer_params": {"prompt_token_ids": []}})
    _refused(r, "kv_transfer_params", "non-empty")
    _good_chat(instance)


def test_priority_is_refused_under_first_come_first_served(instance: RunningInstance) -> None:
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY,
                                                 "priority": 5})
    _refused(r, "priority", "first come, first served", "scheduling_policy: priority")
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY,
                                                 "priority": 0})
    assert r.status_code == 200, r.text


def test_a_custom_role_is_rendered_by_the_chat_template(instance: RunningInstance,
                                                        tokenizer: Any) -> None:
    messages = [{"role": "reviewer", "content": "Looks fine."},
                {"role": "user", "content": "Say yes."}]
    r = _post(instance, "/tokenize", {"messages": messages})
    assert r.status_code == 200, r.text
    rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
    assert r.json()["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    r = _post(instance, "/v1/chat/completions", {"messages": messages, **GREEDY,
                                                 "return_prompt_text": True})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_text"] == rendered


def test_logprobs_as_a_string_is_coerced_as_vllm_does(instance: RunningInstance) -> None:
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY,
                                                 "logprobs": "true"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"]["content"]
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY,
                                                 "logprobs": "maybe"})
    _refused(r, "logprobs")
    _good_chat(instance)


def test_user_reaches_the_request_log(instance: RunningInstance) -> None:
    r = _post(instance, "/v1/chat/completions", {"messages": CONVERSATIONS[0], **GREEDY,
                                                 "user": "tenant-7/alice"})
    assert r.status_code == 200, r.text
    request_id = r.headers["x-request-id"]

    def lines() -> list[str]:  # written once the last byte is sent: maybe after we read it
        return [line for line in instance.log().splitlines() if line.startswith(request_id)]

    assert eventually(lambda: bool(lines()))
    (line,) = lines()
    assert 'user="tenant-7/alice"' in line
    assert f"+{r.json()['usage']['completion_tokens']}tok" in line


def test_vllm_extensions_take_effect(instance: RunningInstance) -> None:
    # a logit bias makes the model repeat one token: 32 of them without the detection, and the
    # engine's stop check (vLLM's check_stop) ends the answer at the third with it
    (token,) = _post(instance, "/tokenize", {"model": LLM, "prompt": " a",
                                             "add_special_tokens": False}).json()["tokens"]
    loop = {"prompt": "Say something.", "temperature": 0, "max_tokens": 32,
            "ignore_eos": True, "logit_bias": {str(token): 100}}
    free = _post(instance, "/v1/completions", loop).json()
    assert free["usage"]["completion_tokens"] == 32, free
    r = _post(instance, "/v1/completions", {**loop, "repetition_detection": {
        "max_pattern_size": 2, "min_count": 3}})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3, r.json()
    r = _post(instance, "/v1/completions", {"prompt": "One, two,", "temperature": 0,
                                            "max_tokens": 6, "stream": True,
                                            "ignore_eos": True, "stream_interval": 3})
    assert r.status_code == 200, r.text
    texts = [json.loads(line.removeprefix("data: "))["choices"] for line in r.text.splitlines()
             if line.startswith("data: {")]
    assert 1 <= len([c for c in texts if c and c[0]["text"]]) <= 3  # 6 tokens, 3 a chunk


@pytest.mark.parametrize(("path", "extra", "field", "words"), [
    ("/v1/chat/completions", {"logit_bias": {"a": 1, "b": 2}}, "logit_bias", ("'a', 'b'",)),
    ("/v1/chat/completions", {"logit_bias": {"1": 500, "2": -500}}, "logit_bias",
     ("logit_bias['1']=500", "logit_bias['2']=-500", "-100 to 100")),
    ("/v1/completions", {"prompt": ""}, "prompt", ("prompt must be non-empty",)),
    ("/v1/completions", {"prompt": ["ok", ""]}, "prompt", ("prompt must be non-empty",)),
    ("/v1/chat/completions", {"seed": 2**64}, "seed", ("above the largest seed", "2**63-1")),
    ("/v1/chat/completions", {"seed": -(2**64)}, "seed", ("below the smallest seed",)),
])
def test_messages_say_what_vllm_says(instance: RunningInstance, path: str,
                                     extra: dict[str, Any], field: str,
                                     words: tuple[str, ...]) -> None:
    base = {"messages": CONVERSATIONS[0]} if "chat" in path else {"prompt": "One, two,"}
    _refused(_post(instance, path, {**base, **GREEDY, **extra}), field, *words)
    assert _post(instance, path, {**base, **GREEDY}).status_code == 200
