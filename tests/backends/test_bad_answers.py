"""Whatever the backend, the request path checks its answer against the declared outputs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from podium.backends.base import Backend, InferenceRequest, InferenceResponse, Tensor
from podium.errors import BackendError
from podium.package.manifest import TensorSpec
from podium.package.package import write_manifest
from podium.repository import ModelRepository


class Answering(Backend):
    """A non-classic backend (like an LLM's) that answers with whatever it is told to."""

    decoupled = True

    def __init__(self, package: object, answer: np.ndarray) -> None:
        super().__init__(package)  # type: ignore[arg-type]
        self.answer = answer

    async def load(self) -> None:
        pass

    async def unload(self) -> None:
        pass

    def inputs(self) -> list[TensorSpec]:
        return [TensorSpec(name="x", datatype="FP32", shape=[-1])]

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(name="y", datatype="FP32", shape=[-1, 2])]

    @property
    def max_batch_size(self) -> int:
        return 0

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(outputs=[Tensor("y", "FP32", self.answer)])

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        yield InferenceResponse(outputs=[Tensor("y", "FP32", self.answer)], final=False)
        yield InferenceResponse(outputs=[], final=True)


async def _ask(tmp_path: Path, answer: np.ndarray, *, stream: bool) -> list[InferenceResponse]:
    package = write_manifest(tmp_path, {"name": "answering", "version": "3",
                                        "backend": "python", "module": "model.py"})
    repository = ModelRepository()
    await repository.load(package, backend=Answering(package, answer))
    request = InferenceRequest({"x": Tensor("x", "FP32", np.zeros(1, np.float32))})
    try:
        if stream:
            return [r async for r in repository.infer_stream("answering", None, request)]
        return [await repository.infer("answering", None, request)]
    finally:
        await repository.unload_all()


@pytest.mark.parametrize("stream", [False, True], ids=["infer", "infer_stream"])
def test_a_misshapen_answer_is_an_error_naming_output_and_package(tmp_path: Path,
                                                                  stream: bool) -> None:
    (tmp_path / "model.py").write_text("class Model: pass\n")
    with pytest.raises(BackendError, match=r"answering@3: output 'y' has shape \[3\], expected "
                                           r"\[-1, 2\]"):
        asyncio.run(_ask(tmp_path, np.zeros(3, np.float32), stream=stream))
    good = asyncio.run(_ask(tmp_path, np.zeros((1, 2), np.float32), stream=stream))
    assert good[0].outputs[0].shape == [1, 2]
