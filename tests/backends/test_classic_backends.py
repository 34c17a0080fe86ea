"""xgboost, onnx, torch and python backends loaded from packages, without a server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from podium.backends import create_backend
from podium.backends.base import InferenceRequest, Tensor
from podium.errors import BackendError, PackageError
from podium.examples.builders import synthetic_features, write_onnx_example, write_xgb_example
from podium.package.package import open_package, write_manifest


def score(package_dir: Path, inputs: dict[str, np.ndarray]) -> tuple[list, dict[str, np.ndarray]]:
    """Load the package's backend, score once, unload; returns (input specs, outputs)."""
    async def run() -> tuple[list, dict[str, np.ndarray]]:
        backend = create_backend(open_package(package_dir))
        await backend.load()
        try:
            tensors = {n: Tensor(n, "FP32", a) for n, a in inputs.items()}
            response = await backend.infer(InferenceRequest(tensors))
            return backend.inputs() + backend.outputs(), {t.name: t.data
                                                          for t in response.outputs}
        finally:
            await backend.unload()
    return asyncio.run(run())


@pytest.fixture(scope="module")
def xgb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_xgb_example(tmp_path_factory.mktemp("xgb") / "xgb-example")


def reference(xgb_dir: Path, features: np.ndarray) -> np.ndarray:
    import xgboost

    return xgboost.Booster(model_file=str(xgb_dir / "model.json")).inplace_predict(features)


@pytest.mark.parametrize("model_file", ["model.json", "model.ubj"], ids=["json", "ubj"])
def test_xgboost_derives_io_from_the_booster(xgb_dir: Path, tmp_path: Path,
                                             model_file: str) -> None:
    import xgboost

    xgboost.Booster(model_file=str(xgb_dir / "model.json")).save_model(
        str(tmp_path / model_file))
    write_manifest(tmp_path, {"name": "derived", "backend": "xgboost", "model_file": model_file})
    features = synthetic_features(3, seed=2)
    specs, outputs = score(tmp_path, {"input__0": features})
    assert [(s.name, s.datatype, s.shape) for s in specs] == [
        ("input__0", "FP32", [20]), ("output__0", "FP32", [1])]
    np.testing.assert_allclose(outputs["output__0"][:, 0], reference(xgb_dir, features),
                               rtol=1e-6)


def test_xgboost_without_batch_dimension(xgb_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "model.json").write_bytes((xgb_dir / "model.json").read_bytes())
    write_manifest(tmp_path, {"name": "unbatched", "backend": "xgboost", "max_batch_size": 0})
    features = synthetic_features(1, seed=3)[0]
    _, outputs = score(tmp_path, {"input__0": features})
    assert outputs["output__0"].shape == (1,)
    np.testing.assert_allclose(outputs["output__0"], reference(xgb_dir, features[None]),
                               rtol=1e-6)


def test_onnx_declared_io_overrides_names(tmp_path: Path) -> None:
    write_onnx_example(tmp_path)
    x = np.array([[1, 0, 0, 0]], dtype=np.float32)
    specs, outputs = score(tmp_path, {"x": x})
    assert [s.name for s in specs] == ["x", "y"]
    np.testing.assert_allclose(outputs["y"], [[1.5, 0]])


def test_torchscript_needs_declared_io(tmp_path: Path) -> None:
    import torch

    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 1)), str(tmp_path / "model.pt"))
    write_manifest(tmp_path, {"name": "undeclared", "backend": "torch"})
    with pytest.raises(PackageError, match=r"declare them in podium\.json"):
        score(tmp_path, {})


def test_torch_export_archive_derives_io(tmp_path: Path) -> None:
    import torch

    class Twice(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a * 2, (a + b).sum(dim=1, keepdim=True)

    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Twice(), (torch.ones(2, 3), torch.ones(2, 3)),
                                  dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    write_manifest(tmp_path, {"name": "exported", "backend": "torch", "model_file": "model.pt2"})
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    specs, outputs = score(tmp_path, {"a": a, "b": np.ones((2, 3), dtype=np.float32)})
    assert [(s.name, s.shape) for s in specs] == [("a", [3]), ("b", [3]), ("output__0", [3]),
                                                  ("output__1", [1])]
    np.testing.assert_allclose(outputs["output__0"], a * 2)
    np.testing.assert_allclose(outputs["output__1"], (a + 1).sum(axis=1, keepdims=True))


PYTHON_MODEL = '''
import numpy as np

class Model:
    def execute(self, requests):
        if any((r["x"] < 0).any() for r in requests):
            raise ValueError("negative input")
        if any((r["x"] > 100).any() for r in requests):
            return []
        return [{"y": r["x"] * 3} for r in requests]
'''


def python_package(tmp_path: Path, *, declared: bool = True) -> Path:
    (tmp_path / "model.py").write_text(PYTHON_MODEL)
    io = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
          "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]} if declared else {}
    write_manifest(tmp_path, {"name": "py", "backend": "python", **io})
    return tmp_path


def test_python_model_needs_declared_io(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="must declare its inputs and outputs"):
        score(python_package(tmp_path, declared=False), {})


def test_python_model_failures_fail_the_request_only(tmp_path: Path) -> None:
    async def run() -> np.ndarray:
        backend = create_backend(open_package(python_package(tmp_path)))
        await backend.load()
        try:
            def request(value: float) -> InferenceRequest:
                return InferenceRequest({"x": Tensor("x", "FP32",
                                                     np.full((1, 1), value, np.float32))})
            with pytest.raises(BackendError, match="negative input"):
                await backend.infer(request(-1))
            with pytest.raises(BackendError, match="one response per request"):
                await backend.infer(request(1000))
            return (await backend.infer(request(2))).outputs[0].data
        finally:
            await backend.unload()

    assert asyncio.run(run()).tolist() == [[6.0]]


def test_importing_backends_and_frontends_loads_no_heavy_library() -> None:
    code = ("import sys, podium.backends.xgboost, podium.backends.torch, podium.backends.onnx, "
            "podium.backends.python, podium.backends.vllm.contract, podium.frontends.kserve_http, "
            "podium.frontends.kserve_grpc, podium.repository; "
            "print(sorted(m for m in ('torch', 'xgboost', 'onnxruntime', 'onnx', 'vllm') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
