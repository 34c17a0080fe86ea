"""An OpenAI request body checked, in order, before vLLM's serving objects see it: the seed,
the fields Podium honours (`openai_fields`), each field's JSON type (`openai_types`), the caps
(`openai_limits`), the `constraint` admitted, the structured-output schemas
(`openai_structured`), then vLLM's own request model validates it. Each failure is a 400
naming the field."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from podium.backends.limits import InstanceLimits
from podium.backends.openai_service import CHAT, COMPLETIONS, OpenAIRoute
from podium.backends.vllm import constraint
from podium.backends.vllm.openai_fields import check_fields
from podium.backends.vllm.openai_limits import check_limits
from podium.backends.vllm.openai_structured import check_structured_output, structured_field
from podium.backends.vllm.openai_types import check_types
from podium.errors import InvalidArgument
from podium.validation import describe, first_field


def check_body(route: OpenAIRoute, body: dict[str, Any], caps: InstanceLimits,
               context: int | None) -> None:
    """400 for the first field of `body` Podium does not honour, of a wrong type or past a cap;
    an admitted `constraint` moves into `vllm_xargs`. `context`: the model's, in tokens."""
    check_fields(route.path, body)
    check_types(request_model(route, body), body)
    check_limits(route.path, body, caps, max_model_len=context)
    if "constraint" in body:
        body["vllm_xargs"] = constraint.admit(body.pop("constraint"),
                                              min_tokens=body.get("min_tokens"),
                                              also_constrained_by=structured_field(body))
    check_structured_output(body, context)


def validate(route: OpenAIRoute, body: dict[str, Any]) -> Any:
    """The body as vLLM's own request model (its validators run here)."""
    from vllm.exceptions import VLLMClientError

    model_cls = request_model(route, body)
    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        raise InvalidArgument(describe(exc), param=first_field(exc)) from None
    except VLLMClientError as exc:  # a model validator's verdict: pydantic does not wrap it
        message = str(exc.args[0]) if exc.args else type(exc).__name__
        raise InvalidArgument(message, param=getattr(exc, "parameter", None)) from None


def request_model(route: OpenAIRoute, body: dict[str, Any]) -> type:
    """vLLM's request model for `route` (embeddings: its chat form when `messages` is sent)."""
    if route is CHAT:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest
    if route is COMPLETIONS:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        return CompletionRequest
    from vllm.entrypoints.pooling.embed.protocol import (
        EmbeddingChatRequest,
        EmbeddingCompletionRequest,
    )

    return EmbeddingChatRequest if "messages" in body else EmbeddingCompletionRequest
