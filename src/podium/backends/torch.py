"""PyTorch models scored in-process: TorchScript (.pt) or a torch.export archive (.pt2).

Inputs are passed positionally in declared order; a tuple/list result maps to the declared
outputs in order. TorchScript carries no shapes, so its I/O must be declared; a torch.export
archive's I/O is derived from its example shapes when the manifest omits it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from podium.backends.classic import Arrays, ClassicBackend
from podium.backends.datatypes import datatype_of
from podium.errors import PackageError
from podium.package.manifest import TensorSpec


class TorchBackend(ClassicBackend):
    """A TorchScript module or torch.export program run under `torch.inference_mode`."""

    _module: Any = None
    _exported: Any = None

    def _load_model(self) -> None:
        import torch  # heavy: imported only when a torch model loads

        path = self.package.root / self.manifest.model_file
        if path.suffix == ".pt2":
            self._exported = torch.export.load(str(path))
            self._module = self._exported.module()
        else:
            self._module = torch.jit.load(str(path), map_location="cpu")
            self._module.eval()

    def _derive_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        if self._exported is None:
            return super()._derive_io()
        graph = self._exported.graph
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        inputs = [self._spec(spec.arg.name, placeholders[spec.arg.name].meta["val"])
                  for spec in self._exported.graph_signature.input_specs
                  if spec.kind.name == "USER_INPUT"]
        output_node = next(n for n in graph.nodes if n.op == "output")
        results = output_node.args[0]
        outputs = [self._spec(f"output__{i}", node.meta["val"]) for i, node in enumerate(results)]
        return inputs, outputs

    def _spec(self, name: str, value: Any) -> TensorSpec:
        import torch

        dtype = np.dtype(torch.empty(0, dtype=value.dtype).numpy().dtype)
        datatype = datatype_of(dtype)
        if datatype is None:
            raise PackageError(f"{self.package.root}: tensor {name!r} has dtype {value.dtype}")
        dims = [int(d) if isinstance(d, int) else -1 for d in value.shape]
        return TensorSpec(name=name, datatype=datatype,
                          shape=dims[1:] if self.max_batch_size > 0 else dims)

    def _predict(self, inputs: Arrays) -> Arrays:
        import torch

        args = [torch.from_numpy(np.require(inputs[spec.name], requirements=["C", "W"]))
                for spec in self._inputs]
        with torch.inference_mode():
            result = self._module(*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        if len(result) != len(self._outputs):
            raise PackageError(f"model {self.name!r} returned {len(result)} tensors but declares "
                               f"{len(self._outputs)} outputs")
        return {spec.name: tensor.detach().cpu().numpy()
                for spec, tensor in zip(self._outputs, result, strict=True)}

    def _release(self) -> None:
        self._module = self._exported = None
