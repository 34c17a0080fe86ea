"""The python backend: a user class with `initialize(config)`, `execute(requests)`, `finalize()`.

The package's `module` file defines `class_name` (default `Model`)::

    class Model:
        def initialize(self, config):          # once, at load
            self.models = config["models"]     # call other loaded models (ensembles)
        def execute(self, requests):           # a batch: list of {input name: ndarray}
            return [{"OUT": ...} for r in requests]   # one {output name: ndarray} each
                                               # (or a podium.errors error: that request fails)
        def finalize(self):                    # once, at unload
            ...

`config` holds `model_name`, `model_version`, `model_config` (Triton-style), `parameters`
(the manifest's), `model_repository` (the package directory) and `models`, a `ModelClient`.
`execute` runs in a worker thread, never on the event loop, so it may block.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from podium.backends.base import InferenceRequest, ModelCaller, Tensor
from podium.backends.classic import Arrays, ClassicBackend
from podium.backends.datatypes import datatype_of
from podium.backends.outputs import to_output_array
from podium.errors import BackendError, InvalidArgument, PackageError, PodiumError
from podium.package.paths import named_path


class ModelClient:
    """Lets a python model score other models of the same instance from inside `execute`."""

    def __init__(self, repository: ModelCaller, loop: asyncio.AbstractEventLoop) -> None:
        self._repository = repository
        self._loop = loop

    @property
    def repository(self) -> ModelCaller:
        """The repository calls go through (Triton BLS in an imported model binds it)."""
        return self._repository

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The instance's event loop, on which those calls run."""
        return self._loop

    def infer(self, model: str, inputs: dict[str, np.ndarray], *, version: str | None = None,
              timeout_s: float = 60.0) -> dict[str, np.ndarray]:
        """Score `inputs` on `model` (latest ready version unless given); blocks this thread."""
        tensors = {}
        for name, value in inputs.items():
            array = np.asarray(value)
            datatype = datatype_of(array.dtype)
            if datatype is None:
                raise InvalidArgument(f"input {name!r}: numpy dtype {array.dtype} has no "
                                      "KServe datatype")
            tensors[name] = Tensor(name, datatype, array)
        coroutine = self._repository.infer(model, version, InferenceRequest(inputs=tensors))
        response = asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)
        return {tensor.name: tensor.data for tensor in response.outputs}


class PythonBackend(ClassicBackend):
    """Runs the package's Python class; I/O must be declared in the manifest."""

    _instance: Any = None
    _repository: ModelCaller | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def bind_repository(self, repository: ModelCaller) -> None:
        """Called by the repository before `load`: the handle `config['models']` wraps."""
        self._repository = repository

    async def load(self) -> None:
        if not self._inputs or not self._outputs:
            raise PackageError(f"{self.package.root}: a python model must declare its inputs "
                               "and outputs in podium.json")
        self._loop = asyncio.get_running_loop()
        await super().load()

    def _load_model(self) -> None:
        # resolved inside the package before anything is imported: `../x.py` never runs
        path = named_path(self.package.root, self.manifest.module, "module")
        module_name = f"podium_models.{self.name}.v{self.version}".replace("-", "_")
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise PackageError(f"{path}: not a loadable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        cls = getattr(module, self.manifest.class_name, None)
        if cls is None:
            raise PackageError(f"{path}: defines no class {self.manifest.class_name!r} (set "
                               "`class_name` in podium.json)")
        instance = cls()
        models = (ModelClient(self._repository, self._loop)
                  if self._repository is not None and self._loop is not None else None)
        if hasattr(instance, "initialize"):
            instance.initialize({
                "model_name": self.name,
                "model_version": self.version,
                "model_config": self.config(),
                "parameters": dict(self.manifest.parameters),
                "model_repository": str(self.package.root),
                "models": models,
            })
        self._instance = instance

    def _run_batch(self, items: list[Arrays]) -> list[Arrays | Exception]:
        # no concatenation: execute gets the requests as a list, as Triton's python backend does
        self.num_executions += 1
        try:
            responses = self._instance.execute(items)
        except PodiumError:
            raise
        except Exception as exc:
            raise BackendError(f"model {self.name!r} failed in execute: "
                               f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(responses, list | tuple) or len(responses) != len(items):
            count = f" of {len(responses)}" if isinstance(responses, list | tuple) else ""
            raise BackendError(f"{self.package.key}: execute must return a list of one response "
                               f"per request ({len(items)}), got a {type(responses).__name__}"
                               f"{count}")
        # one bad response fails its own request, not the others of the batch
        return [_or_error(self._checked_response, index, response)
                for index, response in enumerate(responses)]

    def _checked_response(self, index: int, response: Any) -> Arrays:
        """One of execute's responses as declared arrays, or an error naming what is wrong."""
        package = self.package.key
        if not isinstance(response, Mapping):
            raise BackendError(f"{package}: execute's response {index} is "
                               f"{type(response).__name__}, not a dict of output name → array")
        declared = {spec.name: spec for spec in self._outputs}
        for name in response:
            if name not in declared:
                raise BackendError(f"{package}: execute returned output {name!r}, which the "
                                   f"model does not declare (outputs: {', '.join(declared)})")
        outputs = {}
        for name, spec in declared.items():
            if name not in response:
                raise BackendError(f"{package}: execute returned no output {name!r} (declared "
                                   f"{spec.datatype} {spec.shape})")
            outputs[name] = to_output_array(response[name], spec, package=package)
        return outputs

    def _predict(self, inputs: Arrays) -> Arrays:  # pragma: no cover - _run_batch replaces it
        raise NotImplementedError

    def _release(self) -> None:
        if self._instance is not None and hasattr(self._instance, "finalize"):
            self._instance.finalize()
        self._instance = None


def _or_error(check: Callable[[int, Any], Arrays], index: int, response: Any
              ) -> Arrays | Exception:
    if isinstance(response, PodiumError):  # the model failed this request alone
        return response
    try:
        return check(index, response)
    except BackendError as exc:
        return exc
