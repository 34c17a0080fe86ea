"""Bad OpenAI requests on the real engine (SmolLM2 on vLLM, the session's shared instance),
through the official SDK: each a 400 naming the field and the limit, then a good request.

Some are refused by Podium's layer before vLLM runs (n, max_tokens, logprobs), some by vLLM
itself once it has tokenized (a prompt over the context, a token id outside the vocabulary):
both must be a 400, never a 500 or a dead engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.conftest import EMBEDDER, LLM

pytestmark = pytest.mark.engine
CONTEXT = 8192  # the default package's engine_args.max_model_len
VOCABULARY = 49_152  # SmolLM2's
USER = [{"role": "user", "content": "Name a colour."}]
LONG = "hello " * (CONTEXT + 800)  # one token per word and more: past the context


def _chat(client: openai.OpenAI, **fields: Any) -> Any:
    return client.chat.completions.create(model=LLM, messages=fields.pop("messages", USER),
                                          **{"max_tokens": 4, **fields})


def _completion(client: openai.OpenAI, **fields: Any) -> Any:
    return client.completions.create(model=LLM, prompt=fields.pop("prompt", "Red, green,"),
                                     **{"max_tokens": 4, **fields})


def _embedding(client: openai.OpenAI, **fields: Any) -> Any:
    return client.embeddings.create(model=EMBEDDER, input=fields.pop("input", "a colour"),
                                    **fields)


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


CASES: dict[str, tuple[Callable[..., Any], dict[str, Any], str | None, tuple[str, ...]]] = {
    # name: (call, fields, param, what the message says)
    "chat-prompt-over-the-context": (
        _chat, {"messages": [{"role": "user", "content": LONG}]}, None,
        (f"maximum context length is {CONTEXT}",)),
    "completions-prompt-over-the-context": (
        _completion, {"prompt": LONG}, None, (f"maximum context length is {CONTEXT}",)),
    "embeddings-input-over-the-context": (
        _embedding, {"input": LONG}, None, ("maximum context length",)),
    "chat-max-tokens-past-the-context": (
        _chat, {"max_tokens": CONTEXT + 1}, "max_tokens",
        (f"max_tokens={CONTEXT + 1}", f"context of {CONTEXT}")),
    "completions-max-tokens-2**31": (
        _completion, {"max_tokens": 2**31}, "max_tokens", (f"context of {CONTEXT}",)),
    "chat-logit-bias-out-of-vocabulary": (
        _chat, {"logit_bias": {str(VOCABULARY + 10_000): 5}}, "logit_bias",
        (str(VOCABULARY + 10_000), "out-of-vocab")),
    "completions-logit-bias-out-of-vocabulary": (
        _completion, {"logit_bias": {str(VOCABULARY): 5}}, "logit_bias",
        (f"[{VOCABULARY}]", f"Vocabulary size: {VOCABULARY}")),
    "chat-n-over-the-cap": (_chat, {"n": 17}, "n", ("n=17", "cap of 16")),
    "completions-n-16384": (_completion, {"n": 16384}, "n", ("n=16384", "cap of 16")),
    "completions-logprobs-21": (_completion, {"logprobs": 21}, "logprobs",
                                ("logprobs=21", "0 to 20")),
    "chat-top-logprobs-21": (_chat, {"logprobs": True, "top_logprobs": 21}, "top_logprobs",
                             ("top_logprobs=21",)),
    # built on the event loop, its DFA held the server (liveness too) for good: now a 400
    # from the compile worker, its DFA stopped at the state bound
    "chat-constraint-regex-exponential-dfa": (
        _chat, {"extra_body": {"constraint": {"type": "regex", "pattern": "[ab]*a[ab]{20}"}}},
        "constraint.pattern", ("more than 2,000 states", "[ab]*a[ab]{20}")),
    # vLLM's grammar compilers in the server's process: the count unrolled to 17.7 GB (the
    # OOM killer took the server), a self-reference a 500, the rest silently unenforced
    "chat-response-format-min-items-1e9": (
        _chat, {"response_format": _schema({"type": "array", "minItems": 10**9})},
        "response_format.json_schema.schema.minItems", ("minItems=1000000000", "context")),
    "chat-response-format-refers-to-itself": (
        _chat, {"response_format": _schema({"$ref": "#"})}, "response_format.json_schema.schema",
        ("leads back to itself",)),
    "chat-response-format-remote-ref": (
        _chat, {"response_format": _schema({"type": "object", "properties": {
            "a": {"$ref": "http://example.com/a.json"}}})},
        "response_format.json_schema.schema.properties.a.$ref", ("outside the schema",)),
    "chat-response-format-not": (
        _chat, {"response_format": _schema({"not": {"type": "string"}})},
        "response_format.json_schema.schema.not", ("not enforced",)),
    "completions-structured-outputs-then": (
        _completion, {"extra_body": {"structured_outputs": {"json": {
            "type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}}}},
        "structured_outputs.json.if", ("not enforced",)),
    # both masks at once allowed no token: vLLM failed the request with a 500
    "chat-constraint-with-response-format": (
        _chat, {"response_format": {"type": "json_object"},
                "extra_body": {"constraint": {"type": "choice", "choices": ["a"]}}},
        "constraint", ("cannot be combined with response_format json_object",)),
    "completions-constraint-regex-nested-too-deep": (
        _completion, {"extra_body": {"constraint": {"type": "regex",
                                                    "pattern": "(" * 1000 + "a" + ")" * 1000}}},
        "constraint.pattern", ("nested too deeply",)),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_request_is_a_400_and_the_engine_serves_on(
        openai_client: openai.OpenAI,
        case: tuple[Callable[..., Any], dict[str, Any], str | None, tuple[str, ...]]) -> None:
    call, fields, param, says = case
    with pytest.raises(openai.BadRequestError) as caught:
        call(openai_client, **fields)
    error = caught.value
    assert error.status_code == 400
    if param is not None:
        assert error.param == param, error.body
    for text in says:
        assert text in error.message, error.message
    good = call(openai_client)  # the same call without the bad field
    assert good.data if call is _embedding else good.choices
