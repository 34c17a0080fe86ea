"""Limits on what one OpenAI request may ask of an engine, checked before vLLM sees it.

vLLM accepts `n` up to 16,384, any number of stop strings of any length, logprobs over the
whole vocabulary, `max_tokens` of 2**63-1: each lets one request starve every other one. Each
limit here is a 400 naming the field, the value, the limit and the flag (or package field)
that sets it. Types are checked first (`openai_types`), so values here are of the right type
or absent. Defaults and flags are in docs/operations.md ("OpenAI").
"""

from __future__ import annotations

from typing import Any

from podium.backends.limits import InstanceLimits
from podium.errors import InvalidArgument

MAX_LOGPROBS = 20
"""OpenAI's bound on logprobs / top_logprobs; vLLM's -1 ("the whole vocabulary") is refused."""
MAX_TOKEN_ID = 2**31 - 1
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""The OpenAI roles; any other non-empty string is a custom role, rendered (or refused) by the
model's chat template, as `vllm serve` does."""
INT64 = (-(2**63), 2**63 - 1)
"""The bounds vLLM's request models declare for `seed` and `priority`."""


def check_limits(path: str, body: dict[str, Any], limits: InstanceLimits, *,
                 max_model_len: int | None) -> None:
    """400 for the first field of `body` past a limit (`limits`: this model's caps)."""
    _check_n(body.get("n"), limits)
    _check_prompt(body)
    for name in ("max_tokens", "max_completion_tokens"):
        _check_max_tokens(name, body.get(name), max_model_len)
    for name in ("stop", "bad_words"):
        _check_strings(name, body.get(name), limits)
    _check_count("stop_token_ids", body.get("stop_token_ids"), limits.max_stop_strings,
                 "--max-stop-strings")
    for name in ("stop_token_ids", "allowed_token_ids", "logprob_token_ids", "prompt", "input",
                 "tokens"):
        _check_token_ids(name, body.get(name))
    for name in ("top_logprobs", "prompt_logprobs") + (("logprobs",) if path ==
                                                       "/v1/completions" else ()):
        _check_logprobs(name, body.get(name))
    _check_logit_bias(body.get("logit_bias"))
    if path == "/v1/chat/completions/batch":
        _check_conversations(body.get("messages"), limits)
    elif "messages" in body:
        _check_messages(body["messages"], limits.max_messages)
    if "stream_options" in body and body["stream_options"] is not None \
            and body.get("stream") is not True:
        raise InvalidArgument("stream_options applies to streamed answers only; send "
                              "\"stream\": true with it, or remove it", param="stream_options")
    _check_response_format(body.get("response_format"))


def _check_n(n: Any, limits: InstanceLimits) -> None:
    if n is None:
        return
    if n < 1:
        raise InvalidArgument(f"n={n} is out of range; ask for at least 1 completion",
                              param="n")
    if n > limits.max_n:
        raise InvalidArgument(f"n={n} exceeds this model's cap of {limits.max_n} completions "
                              f"per request; lower n, or {limits.how_to_raise_n}", param="n")


def check_int64(name: str, value: Any) -> None:
    """A 400 saying which bound an integer `seed` / `priority` broke (before the type check,
    whose message would only quote the bound)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return
    low, high = INT64
    if value > high:
        raise InvalidArgument(f"{name}={value} is above the largest {name}, {high} (2**63-1): "
                              f"{name} is a signed 64-bit integer", param=name)
    if value < low:
        raise InvalidArgument(f"{name}={value} is below the smallest {name}, {low} (-2**63): "
                              f"{name} is a signed 64-bit integer", param=name)


def _check_prompt(body: dict[str, Any]) -> None:
    """An empty prompt ("", [], [""], [[]]) is a 400 naming `prompt` (vLLM's own message speaks
    of prompt_embeds, which Podium does not take)."""
    if "prompt" not in body:
        return
    prompt = body["prompt"]
    parts = prompt if isinstance(prompt, list) and prompt and isinstance(
        prompt[0], (str, list)) else [prompt]
    if prompt in ("", []) or any(part in ("", []) for part in parts):
        raise InvalidArgument("prompt must be non-empty: send the text (or token ids) to "
                              "complete", param="prompt")


def _check_max_tokens(name: str, value: Any, max_model_len: int | None) -> None:
    if value is None:
        return
    if value < 1:
        raise InvalidArgument(f"{name}={value} is out of range; ask for at least 1 token",
                              param=name)
    if max_model_len and value > max_model_len:
        raise InvalidArgument(f"{name}={value} exceeds the model's context of "
                              f"{max_model_len} tokens (prompt included); lower it",
                              param=name)


def _check_strings(name: str, value: Any, limits: InstanceLimits) -> None:
    if value is None:
        return
    strings = [value] if isinstance(value, str) else value
    _check_count(name, strings, limits.max_stop_strings, "--max-stop-strings")
    for i, text in enumerate(strings):
        if len(text) > limits.max_stop_chars:
            raise InvalidArgument(f"{name}[{i}] is {len(text)} characters long, over the "
                                  f"limit of {limits.max_stop_chars} (--max-stop-chars)",
                                  param=name)


def _check_count(name: str, values: Any, limit: int, flag: str) -> None:
    if isinstance(values, list) and len(values) > limit:
        raise InvalidArgument(f"{name} has {len(values)} entries, over the limit of {limit} "
                              f"({flag})", param=name)


def _check_token_ids(name: str, value: Any) -> None:
    """Token ids are non-negative and fit the engine's int32 (vLLM checks the vocabulary)."""
    if not isinstance(value, list):
        return
    rows = value if value and isinstance(value[0], list) else [value]
    for row in rows:
        for token in row if isinstance(row, list) else ():
            if isinstance(token, int) and not 0 <= token <= MAX_TOKEN_ID:
                raise InvalidArgument(f"{name} holds the token id {token}, which no "
                                      "vocabulary has; token ids are 0 or more", param=name)


def _check_logprobs(name: str, value: Any) -> None:
    # vLLM reads -1 as "the whole vocabulary"; the OpenAI API allows 0..20, and so do we
    if isinstance(value, int) and not isinstance(value, bool) \
            and not 0 <= value <= MAX_LOGPROBS:
        raise InvalidArgument(f"{name}={value} is out of range; use an integer from 0 to "
                              f"{MAX_LOGPROBS}", param=name)


def _check_logit_bias(bias: Any) -> None:
    """Every bad key and every bias out of range named at once (vLLM names them all)."""
    if not isinstance(bias, dict):
        return
    keys = [key for key in bias if not key.isdecimal() or int(key) > MAX_TOKEN_ID]
    if keys:
        listed = ", ".join(repr(key) for key in keys)
        what = f"keys {listed} are not token ids" if len(keys) > 1 else \
            f"key {listed} is not a token id"
        raise InvalidArgument(f"logit_bias {what}; keys are token ids as strings, e.g. "
                              "{\"1234\": -100}", param="logit_bias")
    wrong = [f"logit_bias[{key!r}]={value}" for key, value in bias.items()
             if not -100 <= value <= 100]
    if wrong:
        raise InvalidArgument(f"{', '.join(wrong)} {'are' if len(wrong) > 1 else 'is'} out of "
                              "range; biases are from -100 to 100", param="logit_bias")


def _check_messages(messages: Any, limit: int) -> None:
    if not isinstance(messages, list):
        raise InvalidArgument("messages must be a list of {\"role\", \"content\"} objects",
                              param="messages")
    if not messages:
        raise InvalidArgument("messages is empty; send at least one message",
                              param="messages")
    if len(messages) > limit:
        raise InvalidArgument(f"messages has {len(messages)} entries, over the limit of "
                              f"{limit} (--max-messages)", param="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidArgument(f"{where} must be an object with a role and content",
                                  param=where)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            got = "has no role" if role is None else f"has the role {role!r}"
            raise InvalidArgument(f"{where} {got}; use one of {', '.join(sorted(ROLES))}, or "
                                  "a custom role the model's chat template renders",
                                  param=f"{where}.role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidArgument(f"{where}.content must be a string or a list of content "
                                  f"parts, got {type(content).__name__}",
                                  param=f"{where}.content")


def _check_conversations(conversations: Any, limits: InstanceLimits) -> None:
    """/v1/chat/completions/batch: a list of conversations, each checked as `messages`."""
    if not isinstance(conversations, list) or not conversations:
        raise InvalidArgument("messages must be a non-empty list of conversations, each a "
                              "list of {\"role\", \"content\"} objects", param="messages")
    cap = limits.max_batch_conversations
    if len(conversations) > cap:
        raise InvalidArgument(f"messages holds {len(conversations)} conversations, over the "
                              f"limit of {cap} per batch request (--max-batch-conversations); "
                              "split the batch", param="messages")
    for i, messages in enumerate(conversations):
        if not isinstance(messages, list):
            raise InvalidArgument(f"messages[{i}] must be a conversation: a list of "
                                  "{\"role\", \"content\"} objects", param=f"messages[{i}]")
        try:
            _check_messages(messages, limits.max_messages)
        except InvalidArgument as exc:
            param = f"messages[{i}]" + (exc.param or "").removeprefix("messages")
            raise InvalidArgument(f"conversation {i}: {exc.message}", param=param) from None


def _check_response_format(response_format: Any) -> None:
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        got = "is missing" if schema is None else f"is {type(schema).__name__}, not an object"
        raise InvalidArgument(f"response_format.json_schema.schema {got}; a json_schema "
                              "response format needs {\"json_schema\": {\"name\": ..., "
                              "\"schema\": {...}}}", param="response_format.json_schema.schema")
