"""Honoured OpenAI fields: each reaches vLLM's serving object; any other is a 400 naming it.

Over the in-process app with fake serving objects (vLLM's real request models validate).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from podium.backends.vllm.openai_fields import HONOURED, REFUSED, REFUSED_ON, WITHOUT_EFFECT
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import FakeLlmBackend, add_ready

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
TOKENIZE, DETOKENIZE = "/tokenize", "/detokenize"
BATCH = "/v1/chat/completions/batch"
USER = [{"role": "user", "content": "hello"}]
BASE = {CHAT: {"model": "fake-llm", "messages": USER},
        BATCH: {"model": "fake-llm", "messages": [USER, USER]},
        COMPLETIONS: {"model": "fake-llm", "prompt": "hello"},
        EMBEDDINGS: {"model": "fake-llm", "input": "hello"},
        TOKENIZE: {"model": "fake-llm", "prompt": "hello"},
        DETOKENIZE: {"model": "fake-llm", "tokens": [1, 2]}}


class FakeServing:
    """vLLM's serving objects, recording the validated request models."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def _answer(self, request: Any, raw: Any) -> Any:
        self.requests.append(request)
        if getattr(request, "stream", False):
            async def events() -> Any:
                yield 'data: {"choices": [{"text": "hi"}]}\n\n'
                yield "data: [DONE]\n\n"
            return events()
        return SimpleNamespace(model_dump=lambda **_: {"object": "fake", "choices": []})

    create_chat_completion = create_completion = __call__ = _answer
    create_batch_chat_completion = _answer
    create_tokenize = create_detokenize = _answer


def _client() -> tuple[httpx.AsyncClient, FakeServing]:
    instance = Instance(ServerConfig(grpc_port=-1))
    backend, serving = FakeLlmBackend(), FakeServing()
    # priority is honoured under vLLM's priority scheduling (test_openai_vllm_routes: fcfs)
    backend.args = SimpleNamespace(scheduling_policy="priority")  # type: ignore[attr-defined]
    backend.state = SimpleNamespace(openai_serving_chat=serving,
                                    openai_serving_chat_batch=serving,
                                    openai_serving_completion=serving,
                                    serving_embedding=serving,
                                    serving_tokenization=serving)
    add_ready(instance.repository, backend)
    instance.booted = True
    transport = httpx.ASGITransport(app=build_app(instance))
    return httpx.AsyncClient(transport=transport, base_url="http://t"), serving


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
GENERATION = {
    "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.1,
    "temperature": 0.3, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3, "stop": ["x"],
    "stop_token_ids": [2], "include_stop_str_in_output": True, "ignore_eos": True,
    "min_tokens": 1, "max_tokens": 5, "n": 2, "logit_bias": {"5": 1.0},
    "prompt_logprobs": 1, "allowed_token_ids": [1, 2], "bad_words": ["darn"],
    "skip_special_tokens": False, "spaces_between_special_tokens": False,
    "use_beam_search": True, "length_penalty": 0.5, "stream": True,
    "stream_options": {"stream_options": {"include_usage": True}, "stream": True},
    "echo": True, "response_format": {"type": "json_object"},
    "structured_outputs": {"regex": "a+"}, "truncate_prompt_tokens": 10,
    "truncation_side": "left", "add_special_tokens": False, "request_id": "r-1",
    "cache_salt": "tenant-a", "return_tokens_as_token_ids": True, "return_token_ids": True,
    "constraint": {"type": "choice", "choices": ["a", "b"]},
    "logprob_token_ids": {"logprob_token_ids": [5, 6], "logprobs": True},
    "kv_transfer_params": {"do_remote_decode": False}, "priority": -3, "user": "user-42",
    "repetition_detection": {"max_pattern_size": 4, "min_count": 3},
    "stream_interval": {"stream_interval": 2, "stream": True},
}
CHAT_TEMPLATE = {"add_generation_prompt": False,
                 "continue_final_message": {"continue_final_message": True,
                                            "add_generation_prompt": False},
                 "chat_template_kwargs": {"enable_thinking": False}}
SAMPLES: dict[str, dict[str, Any]] = {
    CHAT: {**GENERATION, **CHAT_TEMPLATE, "logprobs": True, "max_completion_tokens": 5,
           "top_logprobs": {"top_logprobs": 2, "logprobs": True}, "tools": TOOLS,
           "tool_choice": {"tool_choice": "none", "tools": TOOLS},
           "parallel_tool_calls": {"parallel_tool_calls": False, "tools": TOOLS},
           "messages": USER, "model": "fake-llm", "return_prompt_text": True},
    BATCH: {**{name: GENERATION[name] for name in HONOURED[BATCH] & GENERATION.keys()},
            **CHAT_TEMPLATE, "model": "fake-llm", "messages": [USER, USER], "n": 1,
            "logprobs": True, "top_logprobs": {"top_logprobs": 2, "logprobs": True},
            "max_completion_tokens": 5, "tool_choice": "none", "use_beam_search": False,
            "response_format": {"type": "json_object"}},
    COMPLETIONS: {**GENERATION, "logprobs": 2, "prompt": "hi", "model": "fake-llm"},
    EMBEDDINGS: {"model": "fake-llm", "input": ["a", "b"], "encoding_format": "base64",
                 "dimensions": 4, "embed_dtype": "float16", "endianness": "big",
                 "truncate_prompt_tokens": 5, "truncation_side": "left",
                 "add_special_tokens": False, "use_activation": False, "request_id": "r-1",
                 "cache_salt": "tenant-a", "messages": {"messages": USER, "input": None},
                 "priority": 2, "user": "user-42",
                 **{name: {name: value, **(value if isinstance(value, dict) and name in value
                                           else {}), "messages": USER, "input": None}
                    for name, value in CHAT_TEMPLATE.items()}},
    TOKENIZE: {"model": "fake-llm", "prompt": "hi", "add_special_tokens": False,
               "return_token_strs": True, "messages": {"messages": USER, "prompt": None},
               "tools": {"tools": TOOLS, "messages": USER, "prompt": None},
               **{name: {name: value, **(value if isinstance(value, dict) and name in value
                                         else {}), "messages": USER, "prompt": None}
                  for name, value in CHAT_TEMPLATE.items()}},
    DETOKENIZE: {"model": "fake-llm", "tokens": [5, 6]},
}
"""A valid value per honoured field; a dict of several fields where one needs another (the
field's own value, by its own name), `None` dropping a base field."""


def _body(path: str, field: str) -> dict[str, Any]:
    sample = SAMPLES[path][field]
    extra = sample if isinstance(sample, dict) and field in sample else {field: sample}
    body = {**BASE[path], **extra}
    return {k: v for k, v in body.items() if v is not None}


NAMES = {CHAT: "chat", BATCH: "batch", COMPLETIONS: "completions", EMBEDDINGS: "embeddings",
         TOKENIZE: "tokenize", DETOKENIZE: "detokenize"}
HONOURED_CASES = [pytest.param(path, field, id=f"{NAMES[path]}-{field}")
                  for path in HONOURED for field in sorted(HONOURED[path])]


def test_every_honoured_field_has_a_case() -> None:
    assert {path: set(SAMPLES[path]) for path in HONOURED} == {
        path: set(fields) for path, fields in HONOURED.items()}


@pytest.mark.parametrize(("path", "field"), HONOURED_CASES)
async def test_honoured_field_reaches_vllm(path: str, field: str) -> None:
    client, serving = _client()
    async with client:
        r = await client.post(path, json=_body(path, field))
        assert r.status_code == 200, r.text
    (request,) = serving.requests
    if field == "constraint":  # Podium's own: it travels in vllm_xargs
        assert '"choices":["a","b"]' in request.vllm_xargs["podium_constraint"]
    elif field != "model":
        assert field in request.model_fields_set


def _declared(path: str) -> set[str]:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        BatchChatCompletionRequest,
        ChatCompletionRequest,
    )
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.pooling.embed.protocol import (
        EmbeddingChatRequest,
        EmbeddingCompletionRequest,
    )
    from vllm.entrypoints.serve.tokenize.protocol import (
        DetokenizeRequest,
        TokenizeChatRequest,
        TokenizeCompletionRequest,
    )

    models = {CHAT: [ChatCompletionRequest], BATCH: [BatchChatCompletionRequest],
              COMPLETIONS: [CompletionRequest],
              EMBEDDINGS: [EmbeddingChatRequest, EmbeddingCompletionRequest],
              TOKENIZE: [TokenizeChatRequest, TokenizeCompletionRequest],
              DETOKENIZE: [DetokenizeRequest]}[path]
    return {name for model in models for name in model.model_fields}


@pytest.mark.parametrize("path", list(HONOURED))
def test_every_field_vllm_declares_is_decided(path: str) -> None:
    """A vLLM upgrade that adds a request field fails here until Podium decides on it."""
    declared = _declared(path)
    assert HONOURED[path] - {"constraint"} <= declared  # honoured fields exist in vLLM
    decided = (HONOURED[path] | WITHOUT_EFFECT[path].keys() | REFUSED.keys()
               | REFUSED_ON.get(path, {}).keys())
    assert not declared - decided
    assert not HONOURED[path] & (REFUSED.keys() | REFUSED_ON.get(path, {}).keys())


def test_every_refusal_names_a_field_vllm_declares() -> None:
    """The refused lists hold only fields of vLLM's request models (no stale entries)."""
    declared = set().union(*(_declared(path) for path in HONOURED))
    assert REFUSED.keys() <= declared
    for path, reasons in REFUSED_ON.items():  # the batch's: its own, or chat's it lacks
        assert reasons.keys() <= _declared(path) | _declared(CHAT)


REFUSED_CASES = [pytest.param(path, field, id=f"{NAMES[path]}-{field}")
                 for path in HONOURED
                 for field in sorted(((_declared(path) & REFUSED.keys()) - HONOURED[path])
                                     | REFUSED_ON.get(path, {}).keys() | {"frobnicate"})]
REFUSED_CASES += [pytest.param(EMBEDDINGS, "constraint", id="embeddings-constraint"),
                  pytest.param(EMBEDDINGS, "temperature", id="embeddings-temperature")]


@pytest.mark.parametrize(("path", "field"), REFUSED_CASES)
async def test_refused_field_is_a_400_naming_it(path: str, field: str) -> None:
    client, serving = _client()
    async with client:
        r = await client.post(path, json={**BASE[path], field: "x"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert field in error["message"]
        reasons = {**REFUSED, **REFUSED_ON.get(path, {})}
        if field in reasons:
            assert reasons[field] in error["message"]  # says why
        assert not serving.requests
        assert (await client.post(path, json=BASE[path])).status_code == 200
