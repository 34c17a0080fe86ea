"""Triton's ensemble: `ensemble_scheduling { step [...] }` run in-process, each step a call
through the repository to the model it names, tensors routed by `input_map` / `output_map`
(model tensor name → ensemble tensor name). Steps run as soon as their inputs exist."""

from __future__ import annotations

from typing import Any

from podium.backends.base import Backend, InferenceRequest, InferenceResponse, ModelCaller, Tensor
from podium.errors import BackendError, PackageError
from podium.package.manifest import TensorSpec
from podium.triton.config import as_json
from podium.triton.package import TritonPackage


class EnsembleBackend(Backend):
    def __init__(self, package: TritonPackage) -> None:
        super().__init__(package)
        self.triton = package
        self._repository: ModelCaller | None = None
        self._steps = list(package.config.ensemble_scheduling.step)

    @property
    def platform(self) -> str:
        return "ensemble"

    def config(self) -> dict[str, Any]:
        return as_json(self.triton.config)

    def bind_repository(self, repository: ModelCaller) -> None:
        self._repository = repository

    def inputs(self) -> list[TensorSpec]:
        return list(self.manifest.inputs or [])

    def outputs(self) -> list[TensorSpec]:
        return list(self.manifest.outputs or [])

    async def load(self) -> None:
        where = f"{self.triton.root / 'config.pbtxt'}"
        if not self._steps:
            raise PackageError(f"{where}: an ensemble needs ensemble_scheduling.step",
                               param="ensemble_scheduling")
        known = {s.name for s in self.inputs()}
        for step in self._steps:
            known |= set(step.output_map.values())
        for step in self._steps:
            missing = [v for v in step.input_map.values() if v not in known]
            if missing:
                raise PackageError(f"{where}: step {step.model_name!r} reads {missing}, which "
                                   "no input or step provides",
                                   param="ensemble_scheduling.step.input_map")
        absent = [s.name for s in self.outputs() if s.name not in known]
        if absent:
            raise PackageError(f"{where}: outputs {absent} are produced by no step",
                               param="ensemble_scheduling.step.output_map")

    async def unload(self) -> None:
        return None

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if self._repository is None:
            raise BackendError(f"ensemble {self.name!r} has no repository to call")
        tensors: dict[str, Tensor] = dict(request.inputs)
        pending = list(self._steps)
        while pending:
            ready = [s for s in pending if all(v in tensors for v in s.input_map.values())]
            if not ready:
                names = ", ".join(s.model_name for s in pending)
                raise BackendError(f"ensemble {self.name!r}: steps {names} lack inputs")
            for step in ready:
                pending.remove(step)
                inputs = {model: _renamed(tensors[ours], model)
                          for model, ours in step.input_map.items()}
                version = str(step.model_version) if step.model_version > 0 else None
                answer = await self._repository.infer(
                    step.model_name, version,
                    InferenceRequest(inputs=inputs, id=request.id,
                                     requested_outputs=list(step.output_map)))
                for tensor in answer.outputs:
                    ours = step.output_map.get(tensor.name)
                    if ours is not None:
                        tensors[ours] = _renamed(tensor, ours)
        outputs = [tensors[spec.name] for spec in self.outputs()]
        return InferenceResponse(outputs=outputs, id=request.id)


def _renamed(tensor: Tensor, name: str) -> Tensor:
    return Tensor(name, tensor.datatype, tensor.data)
