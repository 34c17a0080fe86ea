"""Triton's `pytorch_libtorch` backend (`platform: "pytorch_libtorch"` or `backend: "pytorch"`):
`<version>/model.pt`, a TorchScript module, scored by Podium's torch backend (torch imported
only when such a model loads).

Tensors are matched as Triton's libtorch backend matches them: inputs named
`<anything>__<index>` (`INPUT__0`, `INPUT__1`) are the forward arguments by index; otherwise
every input name must be an argument name of `forward`. Outputs are named `<anything>__<index>`,
the index into the tuple `forward` returns. `reshape` is applied on the way in and out. Of
Triton's libtorch `parameters`, `INFERENCE_MODE` is honoured; any other is refused by name.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from podium.backends.classic import Arrays
from podium.backends.torch import TorchBackend
from podium.errors import BackendError, PackageError
from podium.triton.config import as_json, parameters_of
from podium.triton.package import TritonPackage

_INDEXED = re.compile(r"^.+__(\d+)$")
_PARAMETERS = {"INFERENCE_MODE"}


class TritonTorchBackend(TorchBackend):
    """A Triton libtorch model version (TorchScript on the CPU)."""

    def __init__(self, package: TritonPackage) -> None:
        super().__init__(package)
        self.triton = package
        self._where = str(package.root / "config.pbtxt")
        self._input_order: list[str] = []
        self._output_index: dict[str, int] = {}
        self._reshape = {t.name: list(t.reshape.shape)
                         for t in [*package.config.input, *package.config.output]
                         if t.HasField("reshape")}
        self._inference_mode = True

    @property
    def platform(self) -> str:
        return "pytorch_libtorch"

    def config(self) -> dict[str, Any]:
        return as_json(self.triton.config)

    @property
    def optional_inputs(self) -> frozenset[str]:
        return frozenset()  # TorchScript takes every argument positionally

    def _read_parameters(self) -> bool:
        parameters = parameters_of(self.triton.config)
        unknown = sorted(set(parameters) - _PARAMETERS)
        if unknown:
            raise PackageError(f"{self._where}: parameters.{unknown[0]} is not honoured by "
                               "Podium's pytorch_libtorch backend (honoured: INFERENCE_MODE); "
                               "remove it",
                               param=f"parameters.{unknown[0]}")
        value = parameters.get("INFERENCE_MODE", "true").strip().lower()
        if value not in ("true", "false"):
            raise PackageError(f"{self._where}: parameters INFERENCE_MODE={value!r} must be "
                               "true or false", param="parameters.INFERENCE_MODE")
        return value == "true"

    def _load_model(self) -> None:
        self._inference_mode = self._read_parameters()
        if not self.triton.model_file.is_file():
            raise PackageError(f"{self.triton.model_file}: no such model file (a TorchScript "
                               "module saved with torch.jit.save)",
                               param="default_model_filename")
        if any(t.optional for t in self.triton.config.input):
            raise PackageError(f"{self._where}: input.optional is not supported by the "
                               "pytorch_libtorch backend", param="input.optional")
        try:
            super()._load_model()
        except Exception as exc:
            raise PackageError(f"{self.triton.model_file}: not a TorchScript module "
                               f"({type(exc).__name__}: {exc})",
                               param="default_model_filename") from None
        self._input_order = self._order_inputs()
        self._output_index = self._index_outputs()

    def _order_inputs(self) -> list[str]:
        names = [spec.name for spec in self._inputs]
        indexed = [_INDEXED.match(name) for name in names]
        if all(indexed):
            by_index = {int(m.group(1)): name for m, name in zip(indexed, names, strict=True)
                        if m is not None}
            if sorted(by_index) != list(range(len(names))):
                raise PackageError(f"{self._where}: input.name: {names} must be indexed 0.."
                                   f"{len(names) - 1} once each (<name>__<index>)",
                                   param="input.name")
            return [by_index[i] for i in range(len(names))]
        arguments = [a.name for a in self._module.forward.schema.arguments][1:]  # not self
        unknown = [name for name in names if name not in arguments]
        if unknown or len(names) != len(arguments):
            raise PackageError(f"{self._where}: input.name: {names} must be <name>__<index> "
                               f"or after forward's arguments {arguments}, one each",
                               param="input.name")
        return arguments

    def _index_outputs(self) -> dict[str, int]:
        index = {}
        for spec in self._outputs:
            match = _INDEXED.match(spec.name)
            if match is None:
                raise PackageError(f"{self._where}: output.name {spec.name!r} must be "
                                   "<name>__<index> (e.g. OUTPUT__0): the index into what "
                                   "forward returns", param="output.name")
            index[spec.name] = int(match.group(1))
        return index

    def _predict(self, inputs: Arrays) -> Arrays:
        import torch

        batch = next(iter(inputs.values())).shape[:1] if self.max_batch_size > 0 else ()
        args = []
        for name in self._input_order:
            array = inputs[name]
            if name in self._reshape:
                array = array.reshape((*batch, *self._reshape[name]))
            args.append(torch.from_numpy(np.require(array, requirements=["C", "W"])))
        mode = torch.inference_mode() if self._inference_mode else torch.no_grad()
        with mode:
            result = self._module(*args)
        results = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        outputs = {}
        for spec in self._outputs:
            position = self._output_index[spec.name]
            if position >= len(results):
                raise BackendError(f"model {self.name!r} returned {len(results)} tensors; "
                                   f"output {spec.name!r} asks for index {position}")
            array = results[position].detach().cpu().numpy()
            if spec.name in self._reshape:
                array = array.reshape((*batch, *spec.shape))
            outputs[spec.name] = array
        return outputs
