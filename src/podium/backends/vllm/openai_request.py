"""An OpenAI request body as a strict subclass of vLLM's own request model.

`strict_model(ChatCompletionRequest)` is vLLM's model with unknown fields forbidden and one
validator that runs Podium's checks first, in order, with the model's caps passed as
validation context (`RequestContext`): the fields Podium honours (`openai_fields`), each JSON
scalar field's type in strict mode, with the bounds vLLM declares (`openai_types`), the caps
(`openai_limits`), the `constraint` admitted into `vllm_xargs`, the structured-output schemas
(`openai_structured`); then vLLM's own validators and fields. Each failure is a 400 naming the
field. The request the serving object gets is an instance of the subclass, so it is vLLM's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, ValidationError, ValidationInfo, model_validator

from podium.backends.limits import InstanceLimits
from podium.backends.openai_service import (
    CHAT,
    CHAT_BATCH,
    COMPLETIONS,
    DETOKENIZE,
    TOKENIZE,
    OpenAIRoute,
)
from podium.backends.vllm import constraint
from podium.backends.vllm.openai_fields import check_fields
from podium.backends.vllm.openai_limits import check_int64, check_limits
from podium.backends.vllm.openai_structured import check_structured_output, structured_field
from podium.backends.vllm.openai_types import check_types
from podium.errors import InvalidArgument
from podium.validation import describe, first_field


@dataclass(frozen=True)
class RequestContext:
    """What the strict models check a body against (their validation context)."""

    route: OpenAIRoute
    caps: InstanceLimits
    """The model's caps (`VllmBackend.caps`)."""
    context: int | None
    """The model's context, in tokens."""


def validate(route: OpenAIRoute, body: dict[str, Any], caps: InstanceLimits,
             context: int | None) -> Any:
    """`body` as the strict form of vLLM's request model for `route`, or a 400 naming why."""
    from vllm.exceptions import VLLMClientError

    model_cls = strict_model(request_model(route, body))
    try:
        return model_cls.model_validate(
            body, context={_CONTEXT_KEY: RequestContext(route, caps, context)})
    except ValidationError as exc:
        raise InvalidArgument(describe(exc), param=first_field(exc)) from None
    except VLLMClientError as exc:  # a model validator's verdict: pydantic does not wrap it
        message = str(exc.args[0]) if exc.args else type(exc).__name__
        raise InvalidArgument(message, param=getattr(exc, "parameter", None)) from None


_CONTEXT_KEY = "podium"


@functools.cache
def strict_model(base: type) -> type:
    """vLLM's request model `base` with unknown fields forbidden and Podium's checks run
    before its own validators (a subclass's "before" validator runs outermost)."""

    def podium_checks(cls: type, data: Any, info: ValidationInfo) -> Any:
        request = (info.context or {}).get(_CONTEXT_KEY)
        if request is None or not isinstance(data, dict):
            return data  # vLLM re-validating its own request: checked already
        return _check(base, data, request)

    namespace = {
        "__module__": __name__,
        "__doc__": f"vLLM's {base.__name__}, strict (see {__name__}).",
        "model_config": ConfigDict(extra="forbid"),
        "podium_checks": model_validator(mode="before")(classmethod(podium_checks)),
    }
    return type(base.__name__, (base,), namespace)


def _check(base: type, data: dict[str, Any], request: RequestContext) -> dict[str, Any]:
    path = request.route.path
    check_fields(path, data)
    for name in ("seed", "priority"):
        check_int64(name, data.get(name))
    check_types(base, data)
    check_limits(path, data, request.caps, max_model_len=request.context)
    if "constraint" in data:
        data = dict(data)
        data["vllm_xargs"] = constraint.admit(data.pop("constraint"),
                                              min_tokens=data.get("min_tokens"),
                                              also_constrained_by=structured_field(data))
    check_structured_output(data, request.context)
    return data


def request_model(route: OpenAIRoute, body: dict[str, Any]) -> type:
    """vLLM's request model for `route` (embeddings, tokenize: the chat form when `messages`
    is sent)."""
    if route is TOKENIZE:
        from vllm.entrypoints.serve.tokenize.protocol import (
            TokenizeChatRequest,
            TokenizeCompletionRequest,
        )

        return TokenizeChatRequest if "messages" in body else TokenizeCompletionRequest
    if route is DETOKENIZE:
        from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest

        return DetokenizeRequest
    if route is CHAT:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest
    if route is CHAT_BATCH:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            BatchChatCompletionRequest,
        )

        return BatchChatCompletionRequest
    if route is COMPLETIONS:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        return CompletionRequest
    from vllm.entrypoints.pooling.embed.protocol import (
        EmbeddingChatRequest,
        EmbeddingCompletionRequest,
    )

    return EmbeddingChatRequest if "messages" in body else EmbeddingCompletionRequest
