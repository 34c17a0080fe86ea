"""The OpenAI request fields Podium honours, per endpoint: every field it accepts reaches vLLM
and has an effect; any other field is a 400 naming it, including fields vLLM's request models
declare but never act on. The table with reasons is in docs/openai.md; keep the two in step.
"""

from __future__ import annotations

from typing import Any

from podium.errors import InvalidArgument

_SAMPLING = frozenset({
    "frequency_penalty", "presence_penalty", "repetition_penalty", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "max_tokens", "n", "logit_bias", "logprobs", "prompt_logprobs",
    "allowed_token_ids", "bad_words", "skip_special_tokens", "spaces_between_special_tokens",
    "use_beam_search", "length_penalty",
})
_GENERATION = _SAMPLING | {
    "model", "stream", "stream_options", "echo", "response_format", "structured_outputs",
    "truncate_prompt_tokens", "truncation_side", "add_special_tokens", "request_id",
    "cache_salt", "return_tokens_as_token_ids", "return_token_ids",
    "constraint",  # Podium's own: admitted, then carried to the engine in vllm_xargs
    "logprob_token_ids", "kv_transfer_params", "repetition_detection", "stream_interval",
    "priority",  # checked against the engine's scheduling policy (`check_priority`)
    "user",  # the request log's, and so per-user accounting (`podium.frontends.openai`)
}
_CHAT_TEMPLATE = frozenset({"add_generation_prompt", "continue_final_message",
                            "chat_template_kwargs"})

HONOURED: dict[str, frozenset[str]] = {
    "/v1/chat/completions": _GENERATION | _CHAT_TEMPLATE | {
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
        "parallel_tool_calls", "return_prompt_text"},
    "/v1/chat/completions/batch": _CHAT_TEMPLATE | {
        # vLLM's BatchChatCompletionRequest: one choice per conversation, n=1, no stream
        "model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
        "logprob_token_ids", "max_tokens", "max_completion_tokens", "n", "presence_penalty",
        "response_format", "seed", "stop", "temperature", "top_p", "user", "tool_choice",
        "use_beam_search", "top_k", "min_p", "repetition_penalty", "structured_outputs",
        "request_id", "priority", "cache_salt", "include_stop_str_in_output", "echo",
        "return_tokens_as_token_ids", "return_token_ids"},
    "/v1/completions": _GENERATION | {"prompt"},
    "/v1/embeddings": _CHAT_TEMPLATE | {
        "model", "input", "messages", "encoding_format", "dimensions", "embed_dtype",
        "endianness", "truncate_prompt_tokens", "truncation_side", "add_special_tokens",
        "use_activation", "request_id", "cache_salt", "priority", "user"},
    "/tokenize": _CHAT_TEMPLATE | {"model", "prompt", "messages", "add_special_tokens",
                                   "return_token_strs", "tools"},
    "/detokenize": frozenset({"model", "tokens"}),
}
"""Fields passed to vLLM with effect, by endpoint."""

WITHOUT_EFFECT: dict[str, dict[str, str]] = {path: {} for path in HONOURED}
"""Fields accepted although they change nothing, and why (none today: see docs/openai.md)."""

REFUSED: dict[str, str] = {
    "vllm_xargs": "it carries Podium's constraint to the engine; send 'constraint' instead",
    "suffix": "fill-in-the-middle works only with models that render it",
    "watermarking": "the engine has no watermark configured",
    "include_reasoning": "the engine has no reasoning parser configured",
    "reasoning_effort": "the engine has no reasoning parser configured",
    "thinking_token_budget": "the engine has no reasoning parser configured",
    "chat_template": "a model's chat template is part of its package",
    "documents": "a model's chat template is part of its package",
    "ec_transfer_params": "Podium runs no disaggregated prefill",
    "session_id": "Podium runs no disaggregated prefill",
    "mm_payload": "Podium's OpenAI API takes text only",
    "return_mm_kwargs": "Podium's OpenAI API takes text only",
    "mm_processor_kwargs": "Podium's OpenAI API takes text only",
    "media_io_kwargs": "Podium's OpenAI API takes text only",
    "prompt_embeds": "the engine does not take prompt embeddings",
    "routed_experts_prompt_start": "the engine returns no routed-expert data (no model Podium "
                                   "packages is a mixture of experts that records it)",
    "padding": "a vLLM extension Podium does not offer",
    "return_token_offsets": "vLLM reads it only on its /render endpoints and ignores it when "
                            "generating",
    "guided_decoding_backend": "vLLM ignores it (deprecated); the engine picks the backend",
}
"""Fields vLLM's request models declare that Podium refuses on every endpoint, and why (the
400 says it)."""

REFUSED_ON: dict[str, dict[str, str]] = {
    "/v1/chat/completions/batch": {
        "best_of": "vLLM's batch endpoint ignores it (one choice per conversation)",
        "length_penalty": "it applies to beam search, which batch chat completions do not run",
        "early_stopping": "it applies to beam search, which batch chat completions do not run",
        # chat's fields the batch model lacks: vLLM would drop them (its model allows extras)
        **dict.fromkeys(("stream", "stream_options"), "a batch is answered in one body; send "
                        "each conversation to /v1/chat/completions to stream"),
        "tools": "vLLM's batch endpoint runs no tools; send the conversation to "
                 "/v1/chat/completions",
    },
}
"""Refusals with a reason of one endpoint's own (a field honoured elsewhere)."""


def check_fields(path: str, body: dict[str, Any]) -> None:
    """A 400 naming the first field of `body` the endpoint at `path` does not honour."""
    accepted = HONOURED[path] | WITHOUT_EFFECT[path].keys()
    unknown = sorted(set(body) - accepted)
    if not unknown:
        return
    reasons = {**REFUSED, **REFUSED_ON.get(path, {})}
    refused = [name for name in unknown if name in reasons]
    if refused:
        name = refused[0]
        raise InvalidArgument(f"field {name!r} is not honoured by Podium's {path}: "
                              f"{reasons[name]}; remove it", param=name)
    raise InvalidArgument(
        f"Unrecognized request argument supplied: {', '.join(unknown)}. Podium rejects "
        f"fields it cannot honour rather than ignoring them (see docs/openai.md); remove "
        f"{'it' if len(unknown) == 1 else 'them'}.", param=unknown[0])
