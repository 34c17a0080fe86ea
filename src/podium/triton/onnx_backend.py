"""Triton's `onnxruntime` backend: `<version>/model.onnx` scored by Podium's ONNX backend, with
the config's tensors checked against the graph at load (a disagreement names the field)."""

from __future__ import annotations

from typing import Any

from podium.backends.onnx import OnnxBackend
from podium.errors import PackageError
from podium.triton.config import as_json
from podium.triton.package import TritonPackage


class TritonOnnxBackend(OnnxBackend):
    def __init__(self, package: TritonPackage) -> None:
        super().__init__(package)
        self.triton = package

    @property
    def platform(self) -> str:
        return "onnxruntime_onnx"

    def config(self) -> dict[str, Any]:
        return as_json(self.triton.config)

    @property
    def optional_inputs(self) -> frozenset[str]:
        return frozenset(t.name for t in self.triton.config.input if t.optional)

    def _load_model(self) -> None:
        if not self.triton.model_file.is_file():
            raise PackageError(f"{self.triton.model_file}: no such model file",
                               param="default_model_filename")
        super()._load_model()
        graph_inputs, graph_outputs = self._derive_io()
        for field, declared, graph in (("input", self._inputs, graph_inputs),
                                       ("output", self._outputs, graph_outputs)):
            _agree(field, declared, graph, str(self.triton.root / "config.pbtxt"))


def _agree(field: str, declared: list, graph: list, where: str) -> None:
    """Each declared tensor exists in the graph with the same datatype and compatible dims."""
    by_name = {spec.name: spec for spec in graph}
    for spec in declared:
        found = by_name.get(spec.name)
        if found is None:
            raise PackageError(f"{where}: {field} {spec.name!r} is not a tensor of the model "
                               f"(the model's {field}s: {', '.join(by_name)})",
                               param=f"{field}.name")
        if found.datatype != spec.datatype:
            raise PackageError(f"{where}: {field} {spec.name!r} has data_type "
                               f"TYPE_{spec.datatype}, the model's is TYPE_{found.datatype}",
                               param=f"{field}.data_type")
        same = len(found.shape) == len(spec.shape) and all(
            a == b or -1 in (a, b) for a, b in zip(found.shape, spec.shape, strict=True))
        if not same:
            raise PackageError(f"{where}: {field} {spec.name!r} has dims {spec.shape}, the "
                               f"model's are {found.shape} (without the batch dimension)",
                               param=f"{field}.dims")
