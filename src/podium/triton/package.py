"""One Triton model version as a Podium `Package`: the manifest is derived from `config.pbtxt`
(tensors, batching, parameters), the model folder is the package root, and the config message
travels with it for the Triton backends (`config()`, reshape, instance count, ensemble steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from podium.errors import PackageError
from podium.package.manifest import (
    DynamicBatching,
    Manifest,
    OnnxManifest,
    PythonManifest,
    TensorSpec,
    TorchManifest,
    describe_validation_error,
)
from podium.package.package import Package
from podium.triton.config import model_config_pb2, parameters_of

PYTHON, ONNX, ENSEMBLE = "triton-python", "triton-onnxruntime", "triton-ensemble"
TORCH = "triton-pytorch"
"""Podium backend names (`podium.backends`) of the Triton backends served."""
_BACKENDS = {"python": PYTHON, "onnxruntime": ONNX, "ensemble": ENSEMBLE, "vllm": "vllm",
             "pytorch": TORCH}
_PLATFORMS = {"onnxruntime_onnx": "onnxruntime", "ensemble": "ensemble",
              "pytorch_libtorch": "pytorch"}
_DEFAULT_FILES = {"python": "model.py", "onnxruntime": "model.onnx", "pytorch": "model.pt"}


@dataclass(frozen=True)
class TritonPackage(Package):
    """A Triton model version; `root` is the model folder (holding config.pbtxt)."""

    config: Any = None
    """The `ModelConfig` message."""
    kind: str = ""
    """Triton's backend name: python, onnxruntime, pytorch, vllm or ensemble."""

    @property
    def backend_name(self) -> str:
        return _BACKENDS[self.kind]

    @property
    def model_file(self) -> Path:
        """The version's model file (`<version>/<default_model_filename>`)."""
        name = self.config.default_model_filename or _DEFAULT_FILES.get(self.kind, "")
        return self.root / self.manifest.version / name


def backend_kind(config: Any, where: str) -> str:
    """Triton's backend of a config: `backend`, else derived from `platform`."""
    kind = config.backend or _PLATFORMS.get(config.platform, "")
    if not kind:
        what = f"platform={config.platform!r}" if config.platform else "no backend"
        raise PackageError(f"{where}: {what}: set backend to one of "
                           f"{', '.join(sorted(_BACKENDS))}", param="backend")
    if kind not in _BACKENDS:
        field = "backend" if config.backend else "platform"
        value = config.backend or config.platform
        raise PackageError(f"{where}: {field}={value!r} is not a backend Podium serves (served: "
                           f"{', '.join(sorted(_BACKENDS))})", param=field)
    return kind


def tensor_specs(tensors: Any, field: str, where: str) -> list[TensorSpec]:
    pb2 = model_config_pb2()
    specs = []
    for tensor in tensors:
        datatype = pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        datatype = "BYTES" if datatype == "STRING" else datatype
        if datatype == "INVALID":
            raise PackageError(f"{where}: {field} {tensor.name!r} has no data_type",
                               param=f"{field}.data_type")
        specs.append(TensorSpec(name=tensor.name, datatype=datatype, shape=list(tensor.dims)))
    return specs


def build_package(root: Path, version: str, config: Any, kind: str) -> TritonPackage:
    """The package of `root`'s version `version` (the config already checked)."""
    where = str(root / "config.pbtxt")
    if kind == "vllm":
        from podium.triton.vllm_model import vllm_manifest

        return TritonPackage(root=root.resolve(), manifest=vllm_manifest(root, version, config),
                             config=config, kind=kind)
    if config.HasField("sequence_batching"):
        _check_sequence_model(config, kind, where)
    batching = None
    if config.HasField("dynamic_batching"):
        settings = config.dynamic_batching
        if config.max_batch_size < 1:
            raise PackageError(f"{where}: dynamic_batching needs max_batch_size >= 1",
                               param="dynamic_batching")
        queue = settings.default_queue_policy.max_queue_size
        try:
            batching = DynamicBatching(
                max_queue_delay_us=settings.max_queue_delay_microseconds,
                preferred_batch_sizes=list(settings.preferred_batch_size),
                max_queue=queue or None)
        except ValidationError as exc:  # e.g. a queue delay past Podium's bound
            raise PackageError(f"{where}: dynamic_batching: {describe_validation_error(exc)}",
                               param="dynamic_batching") from None
    common: dict[str, Any] = {
        "name": root.name, "version": version, "description": f"Triton model {root.name}",
        "inputs": tensor_specs(config.input, "input", where),
        "outputs": tensor_specs(config.output, "output", where),
        "max_batch_size": config.max_batch_size, "dynamic_batching": batching}
    manifest: Manifest
    try:
        if kind == "onnxruntime":
            name = config.default_model_filename or "model.onnx"
            manifest = OnnxManifest(backend="onnx", model_file=f"{version}/{name}", **common)
        elif kind == "pytorch":
            name = config.default_model_filename or "model.pt"
            manifest = TorchManifest(backend="torch", model_file=f"{version}/{name}", **common)
        else:
            name = config.default_model_filename or "model.py"
            manifest = PythonManifest(backend="python", module=f"{version}/{name}",
                                      class_name="TritonPythonModel",
                                      parameters=parameters_of(config), **common)
    except ValidationError as exc:  # a name or value Podium's manifest refuses
        raise PackageError(f"{where}: {describe_validation_error(exc)}",
                           param=_first_field(exc)) from None
    return TritonPackage(root=root.resolve(), manifest=manifest, config=config, kind=kind)


def _check_sequence_model(config: Any, kind: str, where: str) -> None:
    """Stateful models: Python models that answer once (docs/triton.md, sequence batching)."""
    if kind != "python":
        raise PackageError(f"{where}: sequence_batching is served for backend \"python\" "
                           f"only, not {kind!r}", param="sequence_batching")
    if config.model_transaction_policy.decoupled:
        raise PackageError(f"{where}: sequence_batching with model_transaction_policy "
                           "{ decoupled: true } is not supported by Podium",
                           param="sequence_batching")
    from podium.triton.sequence import read_controls

    read_controls(config, where)  # a bad control_input refuses the model at the scan


def _first_field(exc: ValidationError) -> str | None:
    errors = exc.errors()
    return ".".join(str(p) for p in errors[0]["loc"]) if errors and errors[0]["loc"] else None
