"""Backends chosen by name, imported lazily: importing podium never imports torch or vLLM."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podium.backends.base import Backend
    from podium.package.package import Package

_BACKENDS = {
    "vllm": "podium.backends.vllm.backend:VllmBackend",
    "python": "podium.backends.python:PythonBackend",
    "xgboost": "podium.backends.xgboost:XGBoostBackend",
    "torch": "podium.backends.torch:TorchBackend",
    "onnx": "podium.backends.onnx:OnnxBackend",
    "pipeline": "podium.pipelines.backend:PipelineBackend",
    "triton-python": "podium.triton.python_backend:TritonPythonBackend",
    "triton-onnxruntime": "podium.triton.onnx_backend:TritonOnnxBackend",
    "triton-ensemble": "podium.triton.ensemble:EnsembleBackend",
    "triton-pytorch": "podium.triton.libtorch_backend:TritonTorchBackend",
}


def create_backend(package: Package) -> Backend:
    """Instantiate (not load) the backend the package names (its manifest's, or a Triton
    model's)."""
    if package.backend_name == "lora":
        from podium.errors import PackageError

        raise PackageError(f"{package.key} is a LoRA adapter: it is served by an instance of "
                           f"its base ({getattr(package.manifest, 'base', '?')}, with \"lora\" "
                           "on), not on its own; serve a --repository holding both, or "
                           "announce it", param="backend")
    module_name, class_name = _BACKENDS[package.backend_name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(package)
