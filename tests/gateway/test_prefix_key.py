"""What the gateway reads as a request's prefix: chat messages, prompts, KServe text_input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podium.gateway.prefix_key import BLOCK_CHARS, MAX_BLOCKS, PrefixKey, kserve_key, openai_key
from podium.gateway.request_route import route_of

SYSTEM = "You are a careful assistant who answers in French. " * 12


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "llm", "messages": list(messages), **fields}


def blocks(path: str, body: dict[str, Any]) -> tuple[int, ...]:
    key = route_of("POST", path, json.dumps(body).encode()).prefix
    return key.blocks if key is not None else ()


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    num = 0
    while num < min(len(a), len(b)) and a[num] == b[num]:
        num += 1
    return num


def test_chats_with_one_system_prompt_share_its_blocks_and_not_the_rest() -> None:
    one = blocks("/v1/chat/completions", chat({"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": "Bonjour " * 40}))
    two = blocks("/v1/chat/completions", chat({"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": "Salut " * 40}))
    assert shared(one, two) == len(SYSTEM) // BLOCK_CHARS
    assert len(one) > shared(one, two) and len(two) > shared(one, two)


def test_a_conversations_next_turn_starts_with_the_turn_before() -> None:
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Q1 " * 50}]
    before = blocks("/v1/chat/completions", chat(*history))
    after = blocks("/v1/chat/completions", chat(
        *history, {"role": "assistant", "content": "A1 " * 50},
        {"role": "user", "content": "Q2"}))
    assert shared(before, after) == len(before)


@pytest.mark.parametrize("change", [
    pytest.param({"tools": [{"type": "function", "function": {"name": "f"}}]}, id="tools"),
    pytest.param({"role": "user"}, id="role"),
])
def test_what_the_template_renders_first_changes_every_block(change: dict[str, Any]) -> None:
    system = {"role": "system", "content": SYSTEM}
    base = blocks("/v1/chat/completions", chat(system))
    if "role" in change:
        other = blocks("/v1/chat/completions", chat({**system, **change}))
    else:
        other = blocks("/v1/chat/completions", chat(system, **change))
    assert base and other and shared(base, other) == 0


def test_a_cache_salt_keeps_prompts_apart_as_vllm_does() -> None:
    body = {"model": "llm", "prompt": SYSTEM}
    plain = blocks("/v1/completions", body)
    salted = blocks("/v1/completions", {**body, "cache_salt": "tenant-a"})
    assert salted == blocks("/v1/completions", {**body, "cache_salt": "tenant-a"})
    assert shared(plain, salted) == 0
    assert shared(salted, blocks("/v1/completions", {**body, "cache_salt": "tenant-b"})) == 0


def test_content_parts_render_as_their_text() -> None:
    plain = blocks("/v1/chat/completions", chat({"role": "user", "content": SYSTEM}))
    parts = blocks("/v1/chat/completions", chat({"role": "user", "content": [
        {"type": "text", "text": SYSTEM[:100]}, {"type": "text", "text": SYSTEM[100:]}]}))
    assert plain == parts


@pytest.mark.parametrize("prompt", [SYSTEM, [SYSTEM, "second prompt"],
                                    list(range(200)), [list(range(200))]],
                         ids=["text", "batch", "tokens", "token-batch"])
def test_completion_prompts_are_keyed(prompt: Any) -> None:
    assert blocks("/v1/completions", {"model": "llm", "prompt": prompt})


def test_kserve_generate_text_input_is_keyed() -> None:
    body = json.dumps({"text_input": SYSTEM, "parameters": {"max_tokens": 4}}).encode()
    route = route_of("POST", "/v2/models/llm/generate", body)
    assert route.prefix is not None and route.prefix.blocks
    assert route_of("POST", "/v2/models/llm/infer", body).prefix is None


@pytest.mark.parametrize("path,body", [
    ("/v1/embeddings", {"model": "llm", "input": SYSTEM}),
    ("/v1/chat/completions", {"model": "llm", "messages": "not a list"}),
    ("/v1/chat/completions", {"model": "llm", "messages": ["not a message"]}),
    ("/v1/completions", {"model": "llm", "prompt": 42}),
    ("/v1/completions", {"model": "llm"}),
], ids=["embeddings", "messages-str", "message-str", "prompt-int", "no-prompt"])
def test_no_key_for_what_is_not_a_prompt(path: str, body: dict[str, Any]) -> None:
    # the gateway still routes it (least in-flight); the instance judges the body
    route = route_of("POST", path, json.dumps(body).encode())
    assert route.model == "llm" and route.prefix is None


def test_short_prompts_have_no_block_and_long_ones_are_capped() -> None:
    assert PrefixKey("x" * (BLOCK_CHARS - 1)).blocks == ()
    assert len(PrefixKey("x" * BLOCK_CHARS * (MAX_BLOCKS + 5)).blocks) == MAX_BLOCKS
    assert kserve_key("/generate", b"{not json") is None
    assert openai_key("/v1/completions", {"prompt": ""}) is None


def test_one_prompt_under_two_adapters_shares_no_block() -> None:
    body = {"prompt": "x" * (BLOCK_CHARS * 3)}
    keys = [openai_key("/v1/completions", body, model=model).blocks
            for model in ("support-tone@1", "support-tone@2", "billing-tone@1")]
    keys.append(kserve_key("/generate", json.dumps({"text_input": body["prompt"]}).encode(),
                           model="support-tone@1").blocks)
    assert all(len(k) == 3 for k in keys)
    assert len({k[0] for k in keys[:3]}) == 3
    assert keys[3] == keys[0]  # one adapter, one prompt: the same KV over either protocol
    same = openai_key("/v1/completions", body, model="support-tone@1")
    assert same is not None and same.blocks == keys[0]
