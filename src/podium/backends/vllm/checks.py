"""What a KServe generation request must satisfy before the engine sees it, and vLLM's own
rejections in Podium's terms.

vLLM takes `max_tokens=2**63-1` and keeps generating to the end of the context, long after its
client has gone; it rejects out-of-vocabulary token ids, too many logprobs or a prompt past
the context only once the request reaches its input processor, with a `VLLMValidationError`
that is no `ValueError`. Here each is a 400 naming the field, the value and the bound, checked
against the engine's model config (`max_model_len`, `max_logprobs`, the vocabulary) and the
prompt's length in tokens. `n` and the stop lists are bounded by the same caps as the OpenAI
routes (`InstanceLimits.for_package`: the package's `max_n`, else `--max-n`;
`--max-stop-strings`, `--max-stop-chars`), so both protocols refuse the same requests.

vLLM's admission control (`max_num_queued_reqs`, `max_num_queued_tokens`) refuses a request
with `QueueOverflowError` / `MaxQueuedTokensError` (vLLM answers 503), and a request past its
deadline is refused by `deadline_check`; here both are `Overloaded`: 429 / RESOURCE_EXHAUSTED
with Retry-After, on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from podium.backends.limits import InstanceLimits
from podium.backends.vllm.schema import check_structured_outputs
from podium.errors import InvalidArgument, NotFound, Overloaded

MAX_CANDIDATES = 256
"""Most candidates one scoring request may hold (each runs as its own engine request)."""
OVERLOAD_RETRY_AFTER_S = 1.0
"""What a refusal by the engine's admission control tells the client to wait."""
_STRING_LISTS = ("stop", "bad_words")
_INT64 = 2**63
_TOKEN_ID_FIELDS = ("stop_token_ids", "allowed_token_ids")
_LOGPROB_FIELDS = ("logprobs", "prompt_logprobs")
# tokenizing this many characters takes long enough to move off the event loop
_INLINE_TOKENIZE_CHARS = 4096


async def check_generation(engine: Any, prompt: str, kwargs: dict[str, Any],
                           caps: InstanceLimits = InstanceLimits()) -> None:
    """The sampling keyword arguments and the prompt fit the model; else a 400 naming why."""
    config = engine.model_config
    context = int(config.max_model_len)
    vocab = int(config.get_vocab_size())
    for key, value in kwargs.items():
        if isinstance(value, int) and not isinstance(value, bool) and \
                not -_INT64 <= value < _INT64:
            raise InvalidArgument(f"sampling parameter {key}={value} is out of range (a 64-bit "
                                  "integer)", param=key)
    _check_text(kwargs)
    if kwargs.get("structured_outputs") is not None:
        check_structured_outputs(kwargs["structured_outputs"], param="structured_outputs",
                                 context=context)
    num_prompt = await _num_tokens(engine, prompt)
    if num_prompt >= context:
        raise InvalidArgument(f"the prompt uses {num_prompt} tokens, which leaves no room in "
                              f"the model's context of {context}; shorten text_input",
                              param="text_input")
    max_tokens = kwargs.get("max_tokens")
    if max_tokens is not None:
        if max_tokens < 1:
            raise InvalidArgument(f"max_tokens={max_tokens} must be at least 1",
                                  param="max_tokens")
        if max_tokens > context - num_prompt:
            raise InvalidArgument(f"max_tokens={max_tokens} exceeds the model's context of "
                                  f"{context} (prompt uses {num_prompt}); ask for at most "
                                  f"{context - num_prompt}", param="max_tokens")
    _check_counts(kwargs, vocab, int(config.max_logprobs), caps)
    for key in _TOKEN_ID_FIELDS:
        for token_id in kwargs.get(key) or []:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or \
                    not 0 <= token_id < vocab:
                raise InvalidArgument(f"{key} holds {token_id!r}, which is not a token id of "
                                      f"this model (0 to {vocab - 1})", param=key)
    for key in _STRING_LISTS:
        _check_strings(key, kwargs.get(key), caps)
    _check_count("stop_token_ids", kwargs.get("stop_token_ids"), caps)


def check_scoring(engine: Any, context_ids: list[int], candidate_ids: list[list[int]]) -> None:
    """At most MAX_CANDIDATES candidates, each fitting the context together with the text."""
    if len(candidate_ids) > MAX_CANDIDATES:
        raise InvalidArgument(f"{len(candidate_ids)} candidates are over the limit of "
                              f"{MAX_CANDIDATES} per request; split them", param="candidates")
    context = int(engine.model_config.max_model_len)
    longest = max((len(ids) for ids in candidate_ids), default=0)
    if len(context_ids) + longest >= context:
        raise InvalidArgument(f"the context ({len(context_ids)} tokens) and its longest "
                              f"candidate ({longest}) do not fit the model's context of "
                              f"{context}; shorten them", param="context")


def _check_text(kwargs: dict[str, Any]) -> None:
    """Every string a request's JSON text carried (stop, bad_words, a constraint) is valid
    Unicode: a lone surrogate from a `\\ud800` escape cannot be sent to the engine core."""
    stack: list[tuple[str, Any]] = list(kwargs.items())
    while stack:
        key, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidArgument(f"{key} holds a lone UTF-16 surrogate; send valid "
                                          "Unicode text", param=key) from None
        elif isinstance(value, dict):
            stack.extend((key, item) for item in [*value.keys(), *value.values()])
        elif isinstance(value, list | tuple):
            stack.extend((key, item) for item in value)


def _check_counts(kwargs: dict[str, Any], vocab: int, max_logprobs: int,
                  caps: InstanceLimits) -> None:
    n = kwargs.get("n")
    if n is not None and n > caps.max_n:
        raise InvalidArgument(f"n={n} exceeds this model's cap of {caps.max_n} sequences per "
                              f"request; lower n, or {caps.how_to_raise_n}", param="n")
    top_k = kwargs.get("top_k")
    if top_k is not None and top_k > vocab:
        raise InvalidArgument(f"top_k={top_k} exceeds the vocabulary of {vocab} tokens; use "
                              "0 to disable top-k", param="top_k")
    limit = vocab if max_logprobs == -1 else max_logprobs
    for key in _LOGPROB_FIELDS:
        value = kwargs.get(key)
        if value is not None and value > limit:
            raise InvalidArgument(f"{key}={value} exceeds the engine's limit of {limit} "
                                  "(the package's engine_args max_logprobs)", param=key)


def _check_strings(key: str, value: Any, caps: InstanceLimits) -> None:
    if value is None:
        return
    if isinstance(value, str):  # vLLM's SamplingParams takes one string as a one-item list
        value = [value]
    _check_count(key, value, caps)
    for item in value:
        if not isinstance(item, str) or not item:
            raise InvalidArgument(f"{key} holds {item!r}; each entry must be a non-empty "
                                  "string", param=key)
        if len(item) > caps.max_stop_chars:
            raise InvalidArgument(f"{key} holds a string of {len(item)} characters, over the "
                                  f"limit of {caps.max_stop_chars} (--max-stop-chars)",
                                  param=key)


def _check_count(key: str, values: Any, caps: InstanceLimits) -> None:
    if isinstance(values, list | tuple) and len(values) > caps.max_stop_strings:
        raise InvalidArgument(f"{key} has {len(values)} entries, over the limit of "
                              f"{caps.max_stop_strings} (--max-stop-strings)", param=key)


async def _num_tokens(engine: Any, prompt: str) -> int:
    tokenizer = engine.get_tokenizer()
    if inspect.isawaitable(tokenizer):
        tokenizer = await tokenizer
    if len(prompt) <= _INLINE_TOKENIZE_CHARS:
        return len(tokenizer.encode(prompt))
    return len(await asyncio.to_thread(tokenizer.encode, prompt))


@contextlib.contextmanager
def nesting_limit(field: str) -> Iterator[None]:
    """JSON text inside a tensor or parameter (sampling_parameters, a constraint) nested past
    the interpreter's recursion limit is the client's error, not a crash."""
    try:
        yield
    except RecursionError:
        raise InvalidArgument(f"{field} nests too deeply (JSON text inside a tensor or "
                              "parameter); flatten it", param=field) from None


@contextlib.contextmanager
def engine_rejections() -> Iterator[None]:
    """vLLM's client errors (raised by `generate` for a request it will not run) as 4xx."""
    try:
        yield
    except Exception as exc:
        from vllm.exceptions import VLLMClientError, VLLMNotFoundError

        if (overloaded := admission_refusal(exc)) is not None:
            raise overloaded from exc
        if isinstance(exc, VLLMNotFoundError):
            raise NotFound(str(exc)) from exc
        if isinstance(exc, VLLMClientError):
            raise InvalidArgument(f"the engine rejected the request: {exc}",
                                  param=getattr(exc, "parameter", None)) from exc
        raise


def check_room(engine: Any, n: Any, max_n: int) -> None:
    """vLLM's own admission check (`AsyncLLM.check_admission`, the one its serving classes run
    after validating), run before Podium validates the request: when the engine is full, a
    refusal costs no request model, no constraint and no render, so it is answered while the
    engine's output handling keeps the event loop busy (`bench/overload.py`)."""
    check = getattr(engine, "check_admission", None)
    if check is None:  # test doubles
        return
    # a bad n is validation's 400, not a refusal: it counts as one here
    good = isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= max_n
    try:
        check(n if good else 1)
    except Exception as exc:
        if (refusal := admission_refusal(exc)) is not None:
            raise refusal from exc
        raise


def room_refusal(engine: Any) -> Overloaded | None:
    """The 429 any request would get from `engine` now (one sequence: a request of n > 1 is
    refused whenever one is), or None: what the instance answers from a request's head."""
    try:
        check_room(engine, 1, 1)
    except Overloaded as exc:
        return exc
    return None


def admission_refusal(exc: BaseException) -> Overloaded | None:
    """vLLM's admission-control refusal as Overloaded; None for any other exception."""
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    from podium.backends.vllm.deadline_check import refusal

    if (late := refusal(exc)) is not None:
        return late
    if isinstance(exc, QueueOverflowError):
        limit = "max_num_queued_reqs"
        what = "requests"
    elif isinstance(exc, MaxQueuedTokensError):
        limit = "max_num_queued_tokens"
        what = "prompt tokens waiting for prefill"
    else:
        return None
    return overloaded(limit, what)


def overloaded(limit: str, what: str) -> Overloaded:
    """The 429 of a full engine, naming the limit and where it is set."""
    return Overloaded(f"the engine is overloaded: it holds as many {what} as its limit allows "
                      f"({limit}, unless set: what the engine was measured to finish in "
                      "--admission-target-wait-s); retry later, or raise "
                      f"{limit} in the package's manifest or "
                      f"`podium serve --{limit.replace('_', '-')}`",
                      retry_after_s=OVERLOAD_RETRY_AFTER_S, param=limit)


def admission_response(response: Any) -> Overloaded | None:
    """Overloaded when vLLM's OpenAI layer turned an admission refusal into its own error
    response (a 503 with the refusal's message); None for any other response."""
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    error = getattr(response, "error", None)
    if error is None:
        return None
    if getattr(error, "code", None) == 429:
        from podium.backends.vllm.deadline_check import refusal_message

        return refusal_message(error.message)
    if getattr(error, "code", None) != 503:
        return None
    for cls in (QueueOverflowError, MaxQueuedTokensError):
        refusal = cls()
        if error.message == refusal.message:
            return admission_refusal(refusal)
    return None


__all__ = ["MAX_CANDIDATES", "admission_refusal", "admission_response", "check_generation",
           "check_room", "check_scoring", "engine_rejections", "nesting_limit", "room_refusal"]
