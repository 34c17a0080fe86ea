"""An instance app whose OpenAI serving objects generate slowly and record what was cancelled,
served by uvicorn on loopback: the disconnect tests' stand-in for a long vLLM generation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx

from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_backends import add_ready
from tests.support.openai_instance import ContextBackend
from tests.support.servers import Served

MODEL = "slow-llm"
EVENT = 'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'


class SlowServing:
    """vLLM's chat and completion serving objects over a generation that takes `delay_s` per
    event (a whole answer: one event); `cancelled` holds the request ids whose generation
    was cancelled, as AsyncLLM aborts them."""

    def __init__(self) -> None:
        self.delay_s = 10.0
        self.cancelled: set[str] = set()
        self.started: set[str] = set()

    async def _answer(self, request: Any, raw: Any) -> Any:
        request_id = request.request_id
        self.started.add(request_id)
        if request.stream:
            return self._stream(request_id)
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:  # vLLM's full generators answer an error instead
            self.cancelled.add(request_id)
            return SimpleNamespace(model_dump=lambda **_: {"error": "Client disconnected"},
                                   usage=None)
        return SimpleNamespace(model_dump=lambda **_: {"choices": [{"text": "ok"}]},
                               usage=None)

    async def _stream(self, request_id: str) -> AsyncIterator[str]:
        try:
            yield EVENT  # the first token at once, the others slowly
            while True:
                await asyncio.sleep(self.delay_s)
                yield EVENT
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.add(request_id)
            raise

    create_chat_completion = create_completion = _answer


def serve_slow_openai() -> tuple[Served, SlowServing]:
    """The instance app with one ready slow LLM named MODEL, served on loopback and warmed
    up (the first request imports vLLM's request models: many seconds on a busy machine)."""
    instance = Instance(ServerConfig(grpc_port=-1))
    backend = ContextBackend(MODEL)
    serving = SlowServing()
    backend.state = SimpleNamespace(openai_serving_chat=serving,
                                    openai_serving_completion=serving, serving_embedding=None)
    add_ready(instance.repository, backend)
    instance.booted = True
    served = Served(build_app(instance))
    serving.delay_s = 0.0
    for path in ("/v1/chat/completions", "/v1/completions"):
        reply = httpx.post(served.url + path, json=openai_body(path, "warm-up", stream=False),
                           timeout=300)
        assert reply.status_code == 200, reply.text
    return served, serving


def openai_body(path: str, request_id: str, *, stream: bool) -> dict[str, Any]:
    """A request for a long generation on `path` (chat or completion)."""
    body: dict[str, Any] = {"model": MODEL, "request_id": request_id, "stream": stream,
                            "max_tokens": 1000}
    if path.endswith("/chat/completions"):
        return body | {"messages": [{"role": "user", "content": "a long story"}]}
    return body | {"prompt": "a long story"}
