"""An instance app over fake vLLM serving objects, for the OpenAI frontend's tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx

from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import FakeLlmBackend, add_ready

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
TOKENIZE, DETOKENIZE, INVOCATIONS = "/tokenize", "/detokenize", "/invocations"
CONTEXT = 2048
GOOD = {CHAT: {"model": "fake-llm", "messages": [{"role": "user", "content": "hello"}]},
        COMPLETIONS: {"model": "fake-llm", "prompt": "hello"},
        EMBEDDINGS: {"model": "fake-llm", "input": "hello"},
        # `model` is optional on these, as in `vllm serve`: the one model served answers
        TOKENIZE: {"prompt": "hello"},
        DETOKENIZE: {"tokens": [1, 2]},
        INVOCATIONS: {"messages": [{"role": "user", "content": "hello"}]}}


class FakeServing:
    """vLLM's serving objects in one, answering what an engine would."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def _answer(self, request: Any, raw: Any) -> Any:
        self.requests.append(request)
        return SimpleNamespace(model_dump=lambda **_: {"object": "fake", "choices": [
            {"index": 0, "text": "ok"}]})

    create_chat_completion = create_completion = __call__ = _answer
    create_tokenize = create_detokenize = _answer


class ContextBackend(FakeLlmBackend):
    """A fake LLM with a context length, as a loaded vLLM model has."""

    @property
    def max_model_len(self) -> int:
        return CONTEXT


def backend_for(**manifest: Any) -> ContextBackend:
    """A fake LLM whose package manifest has `manifest`'s fields (e.g. max_n)."""
    from podium.package.manifest import parse_manifest
    from podium.package.package import Package

    backend = ContextBackend()
    fields = {**backend.package.manifest.model_dump(exclude_none=True), **manifest}
    backend.package = Package(root=None, manifest=parse_manifest(fields))  # type: ignore[arg-type]
    backend.manifest = backend.package.manifest
    return backend


def openai_app(backend: FakeLlmBackend | None = None, **config: Any) -> tuple[Any, FakeServing]:
    """The instance's ASGI app with one ready fake LLM behind every OpenAI route."""
    instance = Instance(ServerConfig(grpc_port=-1, **config))
    backend = backend or ContextBackend()
    serving = FakeServing()
    backend.state = SimpleNamespace(openai_serving_chat=serving,
                                    openai_serving_completion=serving,
                                    serving_embedding=serving,
                                    serving_tokenization=serving)
    add_ready(instance.repository, backend)
    instance.booted = True
    return build_app(instance), serving


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def assert_good(client: httpx.AsyncClient, path: str = CHAT) -> None:
    """A good request after a bad one still answers 200."""
    r = await client.post(path, json=GOOD[path])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "ok"
