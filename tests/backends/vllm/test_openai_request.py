"""The strict subclasses of vLLM's request models: Podium's checks run inside vLLM's own
validation, with the model's caps as validation context, and what comes out is vLLM's type."""

from __future__ import annotations

import pytest

from podium.backends.limits import InstanceLimits
from podium.backends.openai_service import CHAT, COMPLETIONS
from podium.backends.vllm.openai_request import request_model, strict_model, validate
from podium.errors import InvalidArgument

USER = [{"role": "user", "content": "hello"}]


def test_the_validated_request_is_vllms_own_type() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = validate(CHAT, {"model": "m", "messages": USER, "n": 2}, InstanceLimits(), 64)
    assert isinstance(request, ChatCompletionRequest) and request.n == 2
    assert type(request).__name__ == "ChatCompletionRequest"


def test_the_caps_come_from_the_validation_context() -> None:
    body = {"model": "m", "prompt": "hi", "n": 3}
    assert validate(COMPLETIONS, dict(body), InstanceLimits(), 64).n == 3
    with pytest.raises(InvalidArgument, match="cap of 2 completions") as caught:
        validate(COMPLETIONS, dict(body), InstanceLimits().for_package(2), 64)
    assert caught.value.param == "n"


def test_strict_scalars_and_unknown_fields_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="temperature") as caught:
        validate(CHAT, {"model": "m", "messages": USER, "temperature": "0.5"},
                 InstanceLimits(), 64)
    assert caught.value.param == "temperature"
    with pytest.raises(InvalidArgument, match="frobnicate"):
        validate(CHAT, {"model": "m", "messages": USER, "frobnicate": 1}, InstanceLimits(), 64)


def test_vllms_own_revalidation_without_context_skips_podiums_checks() -> None:
    cls = strict_model(request_model(CHAT, {}))
    request = cls.model_validate({"model": "m", "messages": USER, "n": 10_000})
    assert request.n == 10_000  # checked once, at admission, with the caps in context
