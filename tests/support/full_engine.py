"""A stand-in for vLLM's engine whose admission check refuses while it is full, and a fake LLM
over Triton's generate contract on it."""

from __future__ import annotations

from vllm.exceptions import QueueOverflowError

from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.tensor_text import text_tensor
from podium.backends.vllm import checks
from podium.errors import PodiumError
from podium.package.manifest import TensorSpec
from tests.support.fake_backends import FakeLlmBackend


class FullEngine:
    """vLLM's admission check, refusing while `full`; counts its checks."""

    def __init__(self) -> None:
        self.full = True
        self.checks = 0

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        self.checks += 1
        if self.full:
            raise QueueOverflowError()


ADAPTER = "fake-adapter"
"""The LoRA adapter `GenerateLlm.view` serves, on its base's engine."""


class GenerateLlm(FakeLlmBackend):
    """An LLM over Triton's generate contract on a `FullEngine`, whose `refusal` is
    `VllmBackend`'s (the engine's admission check); it records every request it is handed
    (where vLLM would tokenize), and serves `ADAPTER` as `view` once a test sets one."""

    def __init__(self, name: str = "fake-llm", engine: FullEngine | None = None) -> None:
        super().__init__(name)
        self.engine = engine or FullEngine()
        self.handed: list[str] = []
        self.view: GenerateLlm | None = None

    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec(name="text_input", datatype="BYTES", shape=[1])]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(name="text_output", datatype="BYTES", shape=[-1])]

    def refusal(self) -> PodiumError | None:
        return checks.room_refusal(self.engine)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        self.handed.append(self.name)
        return InferenceResponse(outputs=[text_tensor("text_output", ["hi"])])

    def adapter(self, name: str, version: str | None) -> Backend | None:
        return self.view if name == ADAPTER else None
