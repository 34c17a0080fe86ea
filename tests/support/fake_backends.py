"""A fake LLM backend behind the Backend protocol, with fake vLLM serving objects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from podium.backends.base import Backend, InferenceRequest, InferenceResponse, Tensor
from podium.backends.limits import InstanceLimits
from podium.errors import BackendDead
from podium.package.manifest import TensorSpec, parse_manifest
from podium.package.package import Package
from podium.repository import ModelEntry


class _Result:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return self.data


class FakeChat:
    """Answers like vLLM's OpenAIServingChat: echoes the last message."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.gate: asyncio.Event | None = None

    async def create_chat_completion(self, request: Any, raw: Any) -> Any:
        self.requests.append(request)
        if self.gate is not None:
            await self.gate.wait()
        text = request.messages[-1]["content"]
        if request.stream:
            return self._stream(text)
        return _Result({"object": "chat.completion", "model": request.model,
                        "choices": [{"index": 0, "message": {"role": "assistant",
                                                             "content": text}}]})

    async def _stream(self, text: str) -> AsyncIterator[str]:
        for word in text.split():
            yield f'data: {{"delta": "{word}"}}\n\n'
        yield "data: [DONE]\n\n"


class FakeLlmBackend(Backend):
    """An LLM whose OpenAI service is the real one (`VllmOpenAI`) over fake serving objects
    (`state`: vLLM's app state, as the tests set it)."""

    engine: Any = None  # no vLLM engine: constraints are not compiled at admission here

    def __init__(self, name: str = "fake-llm", version: str = "1") -> None:
        manifest = parse_manifest({"name": name, "version": version, "backend": "vllm",
                                   "weights": {"source": "path", "path": "/nonexistent"}})
        super().__init__(Package(root=None, manifest=manifest))  # type: ignore[arg-type]
        self.chat = FakeChat()
        self.state = SimpleNamespace(openai_serving_chat=self.chat)

    async def load(self) -> None: ...

    async def unload(self) -> None: ...

    def inputs(self) -> list[TensorSpec]:
        return []

    def outputs(self) -> list[TensorSpec]:
        return []

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        raise NotImplementedError

    @property
    def openai(self) -> Any:
        from podium.backends.vllm.openai import VllmOpenAI

        # no serving objects (a standalone package): no OpenAI API, as VllmBackend
        return None if self.state is None else VllmOpenAI(self, self.state)

    @property
    def caps(self) -> InstanceLimits:
        """The instance's caps with the package's max_n, as VllmBackend computes them."""
        return self.limits.for_package(getattr(self.manifest, "max_n", None))


class FakeEngineBackend(FakeLlmBackend):
    """An engine-backed model whose engine can fail a request (recoverable) or die (fatal)."""

    def __init__(self, name: str = "fake-engine", version: str = "1") -> None:
        super().__init__(name, version)
        self.alive = True
        self.fail_next: Exception | None = None

    def is_alive(self) -> bool:
        return self.alive

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(name="out", datatype="BYTES", shape=[1])]

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            if isinstance(error, BackendDead):
                self.alive = False
            raise error
        return InferenceResponse(outputs=[Tensor("out", "BYTES", np.array([b"ok"],
                                                                          dtype=object))])


def add_ready(repository, backend: Backend, loaded_at: float | None = None) -> ModelEntry:
    backend.limits = repository.limits  # as the repository sets them before a load
    entry = ModelEntry(backend, state="READY",
                       loaded_at=time.time() if loaded_at is None else loaded_at)
    repository._entries.setdefault(backend.name, {})[backend.version] = entry
    return entry

