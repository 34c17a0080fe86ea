"""A request whose deadline it cannot meet is refused before the engine runs it.

`install(engine, rates)` wraps the engine's input processor, the step of `AsyncLLM.add_request`
that turns a prompt into token ids, on every path (OpenAI, whose serving classes render the
prompt first, and KServe, which hands the engine text). Right after it, before the request is
counted or queued, a request carrying a deadline (`backends.deadline`) is estimated
(`admission.estimate`: the prefill backlog ahead of it, its own prompt, the tokens it must
produce) and refused with `DeadlineRefused` when the estimate is past its deadline. Without a
deadline nothing is computed.

`DeadlineRefused` is a vLLM `GracefulHTTPError` (as its own admission refusals are), so vLLM
lets it through `generate` untouched; `checks.admission_refusal` turns it into Podium's
`Overloaded`: 429 / RESOURCE_EXHAUSTED with `Retry-After`, like every refusal for load. Not a
504: nothing waited or timed out (the request was never started), the same request with the
same deadline is served once the backlog drains, and a 5xx would count against the version in
a rollout's analysis.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from vllm.exceptions import GracefulHTTPError

from podium.backends import deadline
from podium.backends.vllm import admission
from podium.errors import Overloaded

PREFIX = "the request cannot finish within its deadline"
_RETRY = re.compile(r"retry in (\d+) s")


class DeadlineRefused(GracefulHTTPError):
    """The engine's estimate for a request is past its deadline."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, HTTPStatus.TOO_MANY_REQUESTS)
        self.retry_after_s = retry_after_s


def install(engine: Any, rates: Callable[[], admission.Rates | None]) -> None:
    """Check every request's deadline right after the engine tokenizes it, by the rates in
    force when it arrives (`rates()`: they change when the engine is measured again)."""
    processor = engine.input_processor
    process, process_async = processor.process_inputs, processor.process_inputs_async

    def checked(*args: Any, **kwargs: Any) -> Any:
        request = process(*args, **kwargs)
        _check_by(engine, rates(), request)
        return request

    async def checked_async(*args: Any, **kwargs: Any) -> Any:
        request = await process_async(*args, **kwargs)  # tokenized off the loop: check here
        _check_by(engine, rates(), request)
        return request

    processor.process_inputs, processor.process_inputs_async = checked, checked_async


def _check_by(engine: Any, rates: admission.Rates | None, request: Any) -> None:
    if rates is not None:
        check(engine, rates, request)


def check(engine: Any, rates: admission.Rates, request: Any) -> None:
    """Raise DeadlineRefused when `request` (an EngineCoreRequest) cannot finish in time."""
    left = deadline.remaining()
    if left is None:
        return
    params = request.sampling_params or request.pooling_params
    queued = int(engine.get_num_queued_tokens())
    verdict = admission.estimate(rates, queued, len(request.prompt_token_ids or ()),
                                 admission.must_decode(params))
    if verdict.estimate_s <= left:
        return
    raise DeadlineRefused(
        f"{PREFIX} ({max(left, 0):.3g} s left of X-Request-Timeout or the gRPC deadline): "
        f"by this engine's measured speed it needs at least {verdict.estimate_s:.3g} s "
        f"({queued} prompt tokens wait for prefill ahead of it); retry in "
        f"{verdict.retry_after_s:.0f} s, or give it a longer deadline", verdict.retry_after_s)


def refusal(exc: BaseException) -> Overloaded | None:
    """DeadlineRefused as Overloaded; None for any other exception."""
    if not isinstance(exc, DeadlineRefused):
        return None
    return Overloaded(exc.message, retry_after_s=exc.retry_after_s, param="X-Request-Timeout")


def refusal_message(message: str) -> Overloaded | None:
    """Overloaded for a DeadlineRefused that vLLM's serving class rendered as its own error
    response (only its message survives); None for any other message."""
    if not message.startswith(PREFIX):
        return None
    match = _RETRY.search(message)
    return Overloaded(message, retry_after_s=float(match[1]) if match else 1.0,
                      param="X-Request-Timeout")
