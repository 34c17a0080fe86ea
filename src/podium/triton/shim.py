"""A Triton Python model run by Podium's own `python` backend: what `podium import` writes
for a `backend: "python"` model (its generated `model.py` is `from podium.triton.shim import
TritonShim as Model`).

The package keeps the Triton model file and its config as JSON; the shim loads the
`TritonPythonModel` with Podium's `triton_python_backend_utils`, calls `initialize(args)` with
Triton's keys, and turns each batch of Podium requests (name → array) into `pb_utils`
requests and the responses back. A response with an error fails its own request only (400
for `TritonError.INVALID_ARG`, else 500), as `podium serve --repository` answers it. BLS
(`pb_utils.InferenceRequest(...).exec()` / `async_exec()`) calls the models of the same
instance through the repository Podium's python backend hands in (`config["models"]`); an
`async def execute` is awaited. What it cannot carry (decoupled models, reshape, several
instances) `podium import` refuses.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any

from podium.errors import BackendError, InvalidArgument, PodiumError
from podium.triton.model_file import install_utils, load_model_class


class TritonShim:
    """Podium's python-backend interface around one TritonPythonModel instance."""

    def initialize(self, config: dict[str, Any]) -> None:
        root = Path(config["model_repository"])
        parameters = config["parameters"]
        self.name = config["model_name"]
        self.triton_config = json.loads((root / parameters["triton_config"]).read_text())
        module = f"podium_imported.{self.name}.v{config['model_version']}".replace("-", "_")
        cls = load_model_class(root / parameters["triton_model"], module)
        self.pb_utils = install_utils()
        models = config.get("models")
        if models is not None:  # BLS: exec() goes through this instance's repository
            from podium.triton import bls

            bls.bind(models.repository, models.loop)
        self.model = cls()
        if hasattr(self.model, "initialize"):
            self.model.initialize({
                "model_config": json.dumps(self.triton_config), "model_instance_kind": "CPU",
                "model_instance_name": f"{self.name}_0", "model_instance_device_id": "0",
                "model_repository": str(root), "model_version": str(config["model_version"]),
                "model_name": self.name})

    def execute(self, requests: list[dict[str, Any]]) -> list[dict[str, Any] | PodiumError]:
        pb = self.pb_utils
        calls = [pb.InferenceRequest(model_name=self.name, inputs=[
            pb.Tensor(name, array) for name, array in request.items()]) for request in requests]
        responses = self.model.execute(calls)
        if inspect.iscoroutine(responses):  # an `async def execute` (async_exec BLS calls)
            responses = asyncio.run(responses)
        results: list[dict[str, Any] | PodiumError] = []
        for response in responses or []:
            if response.has_error():  # this request's answer only; the others keep theirs
                error = response.error()
                cls = InvalidArgument if error.code() == error.INVALID_ARG else BackendError
                results.append(cls(error.message()))
                continue
            results.append({t.name(): t.as_numpy() for t in response.output_tensors()})
        return results

    def finalize(self) -> None:
        if hasattr(self.model, "finalize"):
            self.model.finalize()
