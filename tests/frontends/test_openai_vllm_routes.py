"""The routes `vllm serve` has outside /v1 (/tokenize, /detokenize, /invocations): which vLLM
request reaches the serving object, the model found without a `model` field, and the error
shape. Over the in-process app with fake serving objects; the real answers are checked on the
engine in test_openai_tokenize_real.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import add_ready
from tests.support.openai_instance import (
    DETOKENIZE,
    INVOCATIONS,
    TOKENIZE,
    ContextBackend,
    FakeServing,
    client_for,
    openai_app,
)

USER = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(("path", "body", "request_type"), [
    (TOKENIZE, {"prompt": "hi", "add_special_tokens": False, "return_token_strs": True},
     "TokenizeCompletionRequest"),
    (TOKENIZE, {"messages": USER, "add_generation_prompt": False}, "TokenizeChatRequest"),
    (DETOKENIZE, {"tokens": [1, 2, 3]}, "DetokenizeRequest"),
    (INVOCATIONS, {"messages": USER, "max_tokens": 3}, "ChatCompletionRequest"),
    (INVOCATIONS, {"prompt": "hi", "max_tokens": 3}, "CompletionRequest"),
    (INVOCATIONS, {"model": "fake-llm", "input": "hi"}, "EmbeddingCompletionRequest"),
], ids=["tokenize-prompt", "tokenize-chat", "detokenize", "invocations-chat",
        "invocations-completions", "invocations-embeddings"])
async def test_the_body_reaches_vllms_serving_object_as_its_request(
        path: str, body: dict, request_type: str) -> None:
    app, serving = openai_app()
    async with client_for(app) as client:
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
    (request,) = serving.requests
    assert type(request).__name__ == request_type
    assert request.model == "fake-llm"  # found without a `model` field: the one model served
    for name, value in body.items():
        if name != "model":
            assert getattr(request, name) == value or name == "messages"


async def test_without_model_two_served_models_are_a_400_naming_model() -> None:
    instance = Instance(ServerConfig(grpc_port=-1))
    serving = FakeServing()
    for name in ("alpha", "beta"):
        backend = ContextBackend(name)
        backend.state = SimpleNamespace(serving_tokenization=serving)
        add_ready(instance.repository, backend)
    instance.booted = True
    async with client_for(build_app(instance)) as client:
        for path, body in ((TOKENIZE, {"prompt": "hi"}), (DETOKENIZE, {"tokens": [1]}),
                           (INVOCATIONS, {"messages": USER})):
            r = await client.post(path, json=body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]  # the OpenAI error shape outside /v1 too
            assert error["param"] == "model"
            assert "alpha, beta" in error["message"]
        r = await client.post(TOKENIZE, json={"model": "beta", "prompt": "hi"})
        assert r.status_code == 200, r.text
    assert [request.model for request in serving.requests] == ["beta"]


async def test_an_unknown_model_is_a_404_in_the_openai_shape() -> None:
    app, serving = openai_app()
    async with client_for(app) as client:
        r = await client.post(TOKENIZE, json={"model": "nope", "prompt": "hi"})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["param"] == "model"
    assert not serving.requests
