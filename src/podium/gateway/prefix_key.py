"""A request's prompt as the gateway sees it, cut into chained block hashes for prefix routing.

The gateway has no tokenizer: it renders what the engine will turn into tokens (the chat
messages, a completion's prompt, a KServe `text_input`) as text, in order, and hashes it in
blocks of `BLOCK_CHARS` characters. Each block's hash covers every block before it (a chain),
so one hash stands for a whole prefix: two requests share their first k hashes exactly when
their first k blocks of text are equal. A message renders from its own fields only, so a
conversation's next turn starts with the blocks of the turn before.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

BLOCK_CHARS = 128
"""About 32 tokens of English: close to vLLM's KV blocks (16 tokens on GPU), coarse enough to
keep the index small; a prompt shorter than one block gets no prefix routing."""
MAX_BLOCKS = 4096
"""Blocks hashed per request (512 KiB of text); past it a long context's tail is not indexed."""
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
_KSERVE_GENERATE = ("/generate", "/generate_stream")


class PrefixKey:
    """The text a request's prompt renders to, hashed into blocks only when a pick needs it."""

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def blocks(self) -> tuple[int, ...]:
        """Chained hashes of the full blocks of the text (a partial last block is not one)."""
        hashes: list[int] = []
        chained = 0
        end = min(len(self.text) // BLOCK_CHARS, MAX_BLOCKS) * BLOCK_CHARS
        for start in range(0, end, BLOCK_CHARS):
            chained = hash((chained, self.text[start:start + BLOCK_CHARS]))
            hashes.append(chained)
        return tuple(hashes)


def openai_key(path: str, data: dict[str, Any], *, model: str | None = None
               ) -> PrefixKey | None:
    """The prefix of an OpenAI chat or completion request; None for anything else (an
    embedding, a body the instance will refuse: the gateway leaves the verdict to it).
    `model` (name or name@version, as addressed) is part of the key: one prompt under two
    LoRA adapters (or adapter versions) computes different KV, and vLLM shares none of it."""
    try:
        if path == CHAT:
            text = _chat(data)
        elif path == COMPLETIONS:
            text = _prompt(data.get("prompt"))
        else:
            return None
    except (TypeError, ValueError):  # not JSON-renderable: the instance answers the 4xx
        return None
    if not text:
        return None
    salt = data.get("cache_salt")
    # vLLM shares cached blocks only between requests with the same salt
    text = f"\x1d{salt}\x1d{text}" if isinstance(salt, str) and salt else text
    return PrefixKey(_under(model, text))


def _under(model: str | None, text: str) -> str:
    return f"\x1c{model}\x1c{text}" if model else text


def kserve_key(rest: str | None, body: bytes, *, model: str | None = None
               ) -> PrefixKey | None:
    """The prefix of a KServe generate-extension request (`text_input`); None otherwise.
    `model` as in `openai_key` (name, or name@version from the path)."""
    if rest not in _KSERVE_GENERATE:
        return None
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    text = data.get("text_input") if isinstance(data, dict) else None
    return PrefixKey(_under(model, text)) if isinstance(text, str) and text else None


def _chat(data: dict[str, Any]) -> str | None:
    messages = data.get("messages")
    if not isinstance(messages, list):
        return None
    # chat templates put tool definitions ahead of the conversation
    parts = [_json(data["tools"])] if data.get("tools") else []
    for message in messages:
        if not isinstance(message, dict):
            return None
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        parts.append(f"\x1e{message.get('role')}\x1f{_content(message.get('content'))}"
                     + (_json(extra) if extra else ""))
    return "".join(parts)


def _content(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(part["text"] if isinstance(part, dict) and part.get("type") == "text"
                       and isinstance(part.get("text"), str) else _json(part)
                       for part in content)
    return _json(content)


def _prompt(prompt: Any) -> str | None:
    # a batch of prompts is routed by its first: one instance serves the whole request
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return ",".join(map(str, prompt)) + "," if prompt else None
    return None


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
