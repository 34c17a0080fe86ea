"""Bad OpenAI requests: each a 4xx in the OpenAI error shape naming the field and the limit or
value, and a good request on the same server succeeds right after.

Over the instance's in-process app with fake vLLM serving objects (`openai_app`); the request
head limit needs a real HTTP server, so its case runs on uvicorn over loopback.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.openai_instance import (
    CHAT,
    COMPLETIONS,
    CONTEXT,
    DETOKENIZE,
    EMBEDDINGS,
    GOOD,
    INVOCATIONS,
    TOKENIZE,
    assert_good,
    backend_for,
    client_for,
    openai_app,
)
from tests.support.polling import async_eventually
from tests.support.ports import free_port

MB = 1024 * 1024
USER = [{"role": "user", "content": "hello"}]


@dataclass
class Bad:
    """One bad request: a JSON body (or raw bytes) and what its answer must say."""

    path: str
    body: dict[str, Any] | bytes
    status: int
    param: str | None
    says: tuple[str, ...]
    headers: dict[str, str] = field(default_factory=dict)


def chat(status: int = 400, param: str | None = None, *says: str, **fields: Any) -> Bad:
    return Bad(CHAT, {**GOOD[CHAT], **fields}, status, param, says)


def completions(param: str | None, *says: str, **fields: Any) -> Bad:
    return Bad(COMPLETIONS, {**GOOD[COMPLETIONS], **fields}, 400, param, says)


def embeddings(param: str | None, *says: str, **fields: Any) -> Bad:
    return Bad(EMBEDDINGS, {**GOOD[EMBEDDINGS], **fields}, 400, param, says)


def raw(path: str, body: bytes, status: int, param: str | None, *says: str,
        encoding: str | None = None) -> Bad:
    headers = {"content-type": "application/json"}
    if encoding:
        headers["content-encoding"] = encoding
    return Bad(path, body, status, param, says, headers)


def _nested(depth: int, open_: str, close: str) -> bytes:
    """A chat body whose `tools` holds `depth` levels of nesting."""
    head = json.dumps({**GOOD[CHAT]})[:-1].encode()
    return head + b', "tools": ' + open_.encode() * depth + b"1" + close.encode() * depth + b"}"


def _bomb() -> bytes:
    """A chat body padded with 40 MiB of JSON whitespace: valid, and past the 32 MiB limit."""
    return json.dumps(GOOD[CHAT]).encode()[:-1] + b" " * (40 * MB) + b"}"


BOMB = _bomb()

CASES = {
    # the body itself: size, inflated size, nesting, text
    "chat-arrays-nested-100k-deep": raw(CHAT, _nested(100_000, "[", "]"), 400, None,
                                        "deeper than 64 levels", "--max-json-depth"),
    "chat-objects-nested-100k-deep": raw(CHAT, _nested(100_000, '{"a": ', "}"), 400, None,
                                         "deeper than 64 levels", "--max-json-depth"),
    "chat-arrays-nested-65-deep": raw(CHAT, _nested(65, "[", "]"), 400, "tools",
                                      "deeper than 64 levels", "--max-json-depth"),
    "embeddings-input-nested-100k-deep": raw(
        EMBEDDINGS, b'{"model": "fake-llm", "input": ' + b"[" * 100_000 + b"]" * 100_000
        + b"}", 400, None, "deeper than 64 levels"),
    "chat-gzip-bomb": raw(CHAT, gzip.compress(BOMB), 413, "Content-Encoding",
                          "inflates past", "33554432 bytes", "--max-inflated-bytes",
                          encoding="gzip"),
    "completions-deflate-bomb": raw(COMPLETIONS, zlib.compress(BOMB), 413, "Content-Encoding",
                                    "inflates past", "33554432 bytes", "--max-inflated-bytes",
                                    encoding="deflate"),
    "chat-gzip-not-gzip": raw(CHAT, b"plainly not gzip", 400, "Content-Encoding", "gzip",
                              encoding="gzip"),
    "chat-content-invalid-utf8": raw(
        CHAT, b'{"model": "fake-llm", "messages": [{"role": "user", "content": "a\xff\xfeb"}]}',
        400, "messages[0].content", "not UTF-8", "character 1"),
    "chat-content-lone-surrogate": raw(
        CHAT, b'{"model": "fake-llm", "messages": [{"role": "user", "content": "\\ud800"}]}',
        400, "messages[0].content", "lone UTF-16 surrogate", "\\ud800"),
    "completions-prompt-lone-surrogate": raw(
        COMPLETIONS, b'{"model": "fake-llm", "prompt": ["ok", "x\\udfff"]}', 400, "prompt[1]",
        "surrogate"),
    "embeddings-input-invalid-utf8": raw(
        EMBEDDINGS, b'{"model": "fake-llm", "input": "\xc3\x28"}', 400, "input", "not UTF-8"),
    # the model field: an empty version or name around the @
    "chat-model-empty-version": chat(400, "model", "model='fake-llm@'", "name@version",
                                     model="fake-llm@"),
    "completions-model-empty-name": completions("model", "model='@1'", "name@version",
                                                model="@1"),
    # streaming and structured output
    "chat-stream-options-without-stream": chat(400, "stream_options", "stream",
                                               stream_options={"include_usage": True}),
    "completions-stream-options-stream-false": completions(
        "stream_options", "stream", stream=False, stream_options={"include_usage": True}),
    "chat-json-schema-without-schema": chat(
        400, "response_format.json_schema.schema", "is missing",
        response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
    "chat-json-schema-not-an-object": chat(
        400, "response_format.json_schema.schema", "not an object",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
    "chat-stream-a-string": chat(400, "stream", "stream", stream="yes"),
    # n, max_tokens
    "chat-n-0": chat(400, "n", "n=0", "at least 1", n=0),
    "chat-n-over-the-cap": chat(400, "n", "n=17", "cap of 16", "--max-n", n=17),
    "completions-n-16384": completions("n", "n=16384", "cap of 16", n=16384),
    "chat-n-true": chat(400, "n", "n", "integer", n=True),
    "chat-max-tokens-minus-1": chat(400, "max_tokens", "max_tokens=-1", max_tokens=-1),
    "chat-max-tokens-0": chat(400, "max_tokens", "max_tokens=0", "at least 1", max_tokens=0),
    "completions-max-tokens-2**63-1": completions(
        "max_tokens", f"max_tokens={2**63 - 1}", f"context of {CONTEXT}", max_tokens=2**63 - 1),
    "chat-max-tokens-a-string": chat(400, "max_tokens", "max_tokens", "integer",
                                     max_tokens="10"),
    "completions-max-tokens-true": completions("max_tokens", "max_tokens", "integer",
                                               max_tokens=True),
    "chat-max-completion-tokens-2**63-1": chat(
        400, "max_completion_tokens", f"context of {CONTEXT}",
        max_completion_tokens=2**63 - 1),
    "chat-max-tokens-past-context": chat(400, "max_tokens", f"max_tokens={CONTEXT + 1}",
                                         f"context of {CONTEXT}", max_tokens=CONTEXT + 1),
    # sampling types and ranges
    "chat-temperature-a-string": chat(400, "temperature", "temperature", "number",
                                      temperature="0.5"),
    # messages
    "chat-messages-a-string": chat(400, "messages", "messages must be a list",
                                   messages="hello"),
    "chat-messages-empty": chat(400, "messages", "messages is empty", messages=[]),
    "chat-messages-over-1024": chat(400, "messages", "1025 entries", "--max-messages",
                                    messages=USER * 1025),
    "chat-message-a-string": chat(400, "messages[0]", "messages[0] must be an object",
                                  messages=["hello"]),
    "chat-message-without-role": chat(400, "messages[0].role", "has no role",
                                      messages=[{"content": "hi"}]),
    # a custom role ("wizard") is the chat template's to render, as in vllm serve
    "chat-message-empty-role": chat(400, "messages[0].role", "''", "custom role",
                                    messages=[{"role": "", "content": "hi"}]),
    "chat-message-role-a-number": chat(400, "messages[0].role", "42",
                                       messages=[{"role": 42, "content": "hi"}]),
    "chat-content-a-number": chat(400, "messages[0].content", "string or a list", "int",
                                  messages=[{"role": "user", "content": 42}]),
    # stop strings, token ids
    "completions-1-mb-stop-string": completions("stop", f"{MB} characters", "limit of 1024",
                                                "--max-stop-chars", stop="x" * MB),
    "completions-70-bad-words": completions("bad_words", "70 entries",
                                            bad_words=[f"w{i}" for i in range(70)]),
    "chat-70-stop-token-ids": chat(400, "stop_token_ids", "70 entries",
                                   stop_token_ids=list(range(70))),
    "completions-prompt-token-id-minus-1": completions("prompt", "prompt[1]", "greater than or "
                                                       "equal to 0", "-1", prompt=[5, -1]),
    "completions-prompt-token-id-2**31": completions("prompt", f"token id {2**31}",
                                                     prompt=[[5, 2**31]]),
    "embeddings-input-token-id-2**40": embeddings("input", f"token id {2**40}",
                                                  input=[[1, 2**40]]),
    "completions-prompt-empty": completions("prompt", "prompt must be non-empty", prompt=""),
    "completions-prompt-empty-list": completions("prompt", "prompt must be non-empty",
                                                 prompt=[]),
    "completions-prompt-one-empty": completions("prompt", "prompt must be non-empty",
                                                prompt=["ok", ""]),
    "completions-prompt-null": completions("prompt", "must be provided and non-empty",
                                           prompt=None),
    "completions-allowed-token-id-minus-1": completions("allowed_token_ids", "token id -1",
                                                        allowed_token_ids=[-1]),
    # logprobs
    "completions-logprobs-21": completions("logprobs", "logprobs=21", "0 to 20", logprobs=21),
    "completions-logprobs-minus-1": completions("logprobs", "logprobs=-1", logprobs=-1),
    "completions-prompt-logprobs-21": completions("prompt_logprobs", "prompt_logprobs=21",
                                                  prompt_logprobs=21),
    # logit_bias
    "chat-logit-bias-key-abc": chat(400, "logit_bias", "'abc'", "not a token id",
                                    logit_bias={"abc": 1}),
    "chat-logit-bias-value-1000": chat(400, "logit_bias", "1000", "-100 to 100",
                                       logit_bias={"5": 1000}),
    "chat-logit-bias-two-bad-keys": chat(400, "logit_bias", "keys 'a', 'b' are not token ids",
                                         logit_bias={"a": 1, "b": 2}),
    "chat-logit-bias-two-out-of-range": chat(400, "logit_bias", "logit_bias['5']=1000",
                                             "logit_bias['6']=-1000",
                                             logit_bias={"5": 1000, "6": -1000}),
    "chat-seed-too-big": chat(400, "seed", "above the largest seed", "2**63-1",
                              seed=2**64),
    "chat-seed-too-small": chat(400, "seed", "below the smallest seed", "-2**63",
                                seed=-(2**64)),
    "chat-priority-too-big": chat(400, "priority", "above the largest priority",
                                  priority=2**63),
    "chat-priority-under-fcfs": chat(400, "priority", "first come, first served",
                                     "scheduling_policy: priority", priority=3),
    # tools, embeddings fields
    "embeddings-dimensions-a-string": embeddings("dimensions", "dimensions", dimensions="4"),
    # /tokenize, /detokenize, /invocations (vLLM's routes outside /v1)
    "tokenize-prompt-a-number": Bad(TOKENIZE, {"prompt": 5}, 400, "prompt", ("prompt",)),
    "tokenize-neither-prompt-nor-messages": Bad(TOKENIZE, {"model": "fake-llm"}, 400,
                                                "prompt", ("prompt",)),
    "tokenize-chat-template": Bad(TOKENIZE, {"messages": USER, "chat_template": "{{ x }}"},
                                  400, "chat_template", ("chat_template", "package")),
    "tokenize-return-token-strs-a-string": Bad(TOKENIZE, {"prompt": "a",
                                                          "return_token_strs": "yes"},
                                               400, "return_token_strs", ("return_token_strs",)),
    "tokenize-continue-and-generation-prompt": Bad(
        TOKENIZE, {"messages": USER, "continue_final_message": True,
                   "add_generation_prompt": True}, 400, None, ("continue_final_message",)),
    "tokenize-unknown-field": Bad(TOKENIZE, {"prompt": "a", "frobnicate": 1}, 400,
                                  "frobnicate", ("frobnicate",)),
    "tokenize-model-a-number": Bad(TOKENIZE, {"prompt": "a", "model": 5}, 400, "model",
                                   ("model",)),
    "detokenize-token-minus-1": Bad(DETOKENIZE, {"tokens": [1, -1]}, 400, "tokens",
                                    ("tokens[1]", "(got -1)")),
    "detokenize-token-2**40": Bad(DETOKENIZE, {"tokens": [2**40]}, 400, "tokens",
                                  (str(2**40),)),
    "detokenize-tokens-a-string": Bad(DETOKENIZE, {"tokens": "abc"}, 400, "tokens",
                                      ("tokens",)),
    "invocations-no-known-shape": Bad(INVOCATIONS, {"text": "hi"}, 400, None,
                                      ("/invocations", "messages or prompt or input")),
    "invocations-chat-temperature-a-string": Bad(
        INVOCATIONS, {"messages": USER, "temperature": "hot"}, 400, "temperature",
        ("temperature",)),
    "invocations-completions-unknown-field": Bad(
        INVOCATIONS, {"prompt": "hi", "frobnicate": 1}, 400, "frobnicate", ("frobnicate",)),
}
"""Each of these failed this test before the OpenAI validation layer (`json_body`,
`openai_types`, `openai_limits`): a 5xx, a 200 reaching vLLM, or a 4xx naming neither the field
nor the limit."""

GUARDS = {
    "chat-body-over-16-mib": raw(CHAT, BOMB[: 17 * MB], 413, None, "16777216-byte limit",
                                 "--max-body-bytes"),
    "chat-body-a-list": raw(CHAT, b"[1, 2]", 400, None, "must be a JSON object", "an array"),
    "completions-top-p-a-list": completions("top_p", "top_p", top_p=[0.5]),
    "chat-seed-2**64": chat(400, "seed", "seed", str(2**64), seed=2**64),
    "completions-seed-a-float": completions("seed", "seed", seed=1.5),
    "chat-70-stop-strings": chat(400, "stop", "at most 4 items", "not 70",
                                 stop=[f"s{i}" for i in range(70)]),
    "chat-stop-a-number": chat(400, "stop", "stop", stop=7),
    "chat-top-logprobs-minus-1": chat(400, "top_logprobs", "top_logprobs=-1", logprobs=True,
                                      top_logprobs=-1),
    "chat-top-logprobs-21": chat(400, "top_logprobs", "top_logprobs=21", "0 to 20",
                                 logprobs=True, top_logprobs=21),
    "chat-logprobs-a-number": chat(400, "logprobs", "logprobs", logprobs=5),
    "completions-logit-bias-value-a-string": completions("logit_bias", "logit_bias",
                                                         logit_bias={"5": "high"}),
    "chat-tools-a-string": chat(400, "tools", "tools", tools="f"),
    "chat-tools-entry-a-number": chat(400, "tools", "tools", tools=[1]),
    "embeddings-input-a-number": embeddings("input", "input", input=42),
    "embeddings-encoding-format-unknown": embeddings("encoding_format", "encoding_format",
                                                     encoding_format="hex"),
}
"""Bad requests the instance already refused before this layer (vLLM's own models or an
earlier check): kept so the refusal stays a 400 naming the field, then a good request."""


@pytest.mark.parametrize("case", [*CASES.values(), *GUARDS.values()],
                         ids=[*CASES, *GUARDS])
async def test_bad_request_is_a_4xx_naming_it(case: Bad) -> None:
    app, serving = openai_app()
    async with client_for(app) as client:
        if isinstance(case.body, bytes):
            r = await client.post(case.path, content=case.body, headers=case.headers)
        else:
            r = await client.post(case.path, json=case.body)
        _assert_refused(r, case)
        assert not serving.requests  # refused before vLLM's serving object ran
        await assert_good(client, case.path)


def _assert_refused(r: Any, case: Bad) -> None:
    """The OpenAI error object, naming the field (or a path inside it) and the limit."""
    assert r.status_code == case.status, r.text[:2000]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == case.status
    if case.param is None:
        assert error["param"] is None, error
    else:
        assert error["param"] == case.param or error["param"].startswith(
            (case.param + "[", case.param + ".")), error
    for text in case.says:
        assert text in error["message"], error
    assert len(error["message"]) < 1000  # names the value, never echoes a huge one


def test_the_table_covers_each_route() -> None:
    assert len(CASES) >= 30
    assert {case.path for case in CASES.values()} == {CHAT, COMPLETIONS, EMBEDDINGS, TOKENIZE,
                                                      DETOKENIZE, INVOCATIONS}


async def test_a_100_kb_header_is_a_431_and_the_server_keeps_serving() -> None:
    """The request head is bounded by uvicorn's protocol, so this needs a real HTTP server."""
    import httpx
    import uvicorn

    from podium.server.config import ServerConfig
    from podium.server.serve import uvicorn_config

    app, _ = openai_app()
    port = free_port()
    config = uvicorn_config(app, ServerConfig(host="127.0.0.1", http_port=port, grpc_port=-1))
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        assert await async_eventually(lambda: server.started, 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.post(CHAT, json=GOOD[CHAT], headers={"x-big": "a" * 100_000})
            assert r.status_code == 431, r.text
            error = r.json()["error"]
            assert error["code"] == 431
            assert "--max-header-bytes" in error["message"]
            await assert_good(client, CHAT)
    finally:
        server.should_exit = True
        await task


CONFIGURED = {"max_n": 4, "max_stop_strings": 3, "max_stop_chars": 10, "max_messages": 2,
              "max_json_depth": 8, "max_inflated_bytes": 4096}
PAST_CONFIGURED = {
    "n-past-max-n": (chat(400, "n", "n=5", "cap of 4", "--max-n", n=5)),
    "bad-words-past-max-stop-strings": completions("bad_words", "4 entries", "limit of 3",
                                                   bad_words=["a", "b", "c", "d"]),
    "stop-past-max-stop-chars": completions("stop", "11 characters", "limit of 10",
                                            stop="x" * 11),
    "messages-past-max-messages": chat(400, "messages", "3 entries", "limit of 2",
                                       messages=USER * 3),
    "nesting-past-max-json-depth": raw(CHAT, _nested(8, "[", "]"), 400, "tools",
                                       "deeper than 8 levels"),
    "gzip-past-max-inflated-bytes": raw(CHAT, gzip.compress(BOMB[:8192]), 413,
                                        "Content-Encoding", "4096 bytes", encoding="gzip"),
}


@pytest.mark.parametrize("case", list(PAST_CONFIGURED.values()), ids=list(PAST_CONFIGURED))
async def test_each_limit_is_what_the_instance_was_configured_with(case: Bad) -> None:
    app, _ = openai_app(**CONFIGURED)
    async with client_for(app) as client:
        body = {"content": case.body, "headers": case.headers} if isinstance(
            case.body, bytes) else {"json": case.body}
        _assert_refused(await client.post(case.path, **body), case)
        await assert_good(client, case.path)


async def test_a_package_max_n_overrides_the_instances() -> None:
    app, _ = openai_app(backend_for(max_n=2), max_n=8)
    async with client_for(app) as client:
        r = await client.post(CHAT, json={**GOOD[CHAT], "n": 3})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "n"
        assert "cap of 2" in error["message"] and "max_n in the package's manifest" in (
            error["message"])
        assert (await client.post(CHAT, json={**GOOD[CHAT], "n": 2})).status_code == 200


def test_the_limit_flags_of_podium_serve_reach_the_instance(monkeypatch) -> None:
    from podium.cli import build_parser
    from podium.errors import InvalidArgument
    from podium.server import serve

    def serve_with(*flags: str) -> Any:
        args = build_parser().parse_args(["serve", "--repository", "/nowhere", *flags])
        return args.func(args)  # main() would prepare a metrics directory first

    configs: list[Any] = []
    monkeypatch.setattr(serve, "run_server", lambda config: configs.append(config) or 0)
    serve_with(*(f"--{name.replace('_', '-')}={value}" for name, value in CONFIGURED.items()))
    assert {name: getattr(configs[0], name) for name in CONFIGURED} == CONFIGURED
    with pytest.raises(InvalidArgument, match="--max-n 0: Input should be greater than or "
                       "equal to 1"):
        serve_with("--max-n", "0")
