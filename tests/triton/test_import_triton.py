"""`podium import`: one version of a Triton model written as a podium.json package, then
served by Podium's own backends with the same answers; what a podium.json cannot express is
refused naming the field, and the next good import works."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from podium.backends.base import InferenceRequest, Tensor
from podium.cli import main
from podium.errors import InvalidArgument, PackageError
from podium.package.package import open_package
from podium.repository import ModelRepository
from podium.triton.import_cmd import import_model
from tests.support.triton_layouts import (
    ADD_SUB,
    ADD_SUB_CONFIG,
    ENSEMBLE_CONFIG,
    ONNX_CONFIG,
    REPEAT,
    REPEAT_CONFIG,
    SCALE,
    SCALE_CONFIG,
    write_model,
    write_onnx,
)


def _request(**arrays: np.ndarray) -> InferenceRequest:
    return InferenceRequest(inputs={n: Tensor(n, "FP32", a) for n, a in arrays.items()})


async def test_a_python_model_imports_and_answers_as_it_did(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    config = ADD_SUB_CONFIG.replace("instance_group [ { kind: KIND_CPU count: 2 } ]", "")
    write_model(repo, "add_sub", config, ADD_SUB, versions=("1", "2"))
    assert main(["import", str(repo / "add_sub"), "-o", str(tmp_path / "pkg")]) == 0
    package = open_package(tmp_path / "pkg")
    assert package.key == "add_sub@2" and package.manifest.backend == "python"
    triton_config = json.loads((tmp_path / "pkg" / "triton_config.json").read_text())
    assert triton_config["parameters"]["greeting"]["string_value"] == "hello"
    repository = ModelRepository()
    await repository.load(package)
    try:
        a = np.array([1, 2, 3, 4], dtype=np.float32)
        response = await repository.infer("add_sub", None, _request(INPUT0=a, INPUT1=a))
        outputs = {t.name: t.data for t in response.outputs}
        np.testing.assert_array_equal(outputs["OUTPUT0"], a + a)
        np.testing.assert_array_equal(outputs["OUTPUT1"], a - a)
        with pytest.raises(Exception, match="negative input"):  # the model's TritonError
            await repository.infer("add_sub", None, _request(INPUT0=-a, INPUT1=a))
    finally:
        await repository.unload_all()


async def test_an_onnx_model_imports_with_its_batching(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "onnx_add", ONNX_CONFIG, versions=("1", "2"))
    write_onnx(repo / "onnx_add" / "1" / "model.onnx", 1.0)
    write_onnx(repo / "onnx_add" / "2" / "model.onnx", 10.0)
    manifest = import_model(repo / "onnx_add" / "1", tmp_path / "pkg")  # one version named
    assert manifest["version"] == "1" and manifest["backend"] == "onnx"
    assert manifest["dynamic_batching"]["preferred_batch_sizes"] == [4]
    assert not (tmp_path / "pkg" / "2").exists()
    repository = ModelRepository()
    await repository.load(open_package(tmp_path / "pkg"))
    try:
        x = np.ones((2, 3), dtype=np.float32)
        response = await repository.infer("onnx_add", None, _request(x=x))
        np.testing.assert_allclose(response.outputs[0].data, x + 1)
    finally:
        await repository.unload_all()


@pytest.mark.parametrize(("config", "model", "param"), [
    (ENSEMBLE_CONFIG, None, "platform"),
    (REPEAT_CONFIG, REPEAT, "model_transaction_policy.decoupled"),
    (SCALE_CONFIG.replace('dims: [ 3 ] }', 'dims: [ 3 ] reshape: { shape: [ 1, 3 ] } }', 1),
     SCALE, "input.reshape"),
    (SCALE_CONFIG + "instance_group [ { kind: KIND_CPU count: 3 } ]\n", SCALE,
     "instance_group.count"),
    (SCALE_CONFIG + "optimization { cuda { graphs: true } }\n", SCALE, "optimization"),
], ids=["ensemble", "decoupled", "reshape", "instance-count", "unsupported-field"])
def test_what_a_package_cannot_express_is_refused_naming_it(tmp_path: Path, config: str,
                                                             model: str | None,
                                                             param: str) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "m", config, model)
    write_model(repo, "good", SCALE_CONFIG, SCALE)
    with pytest.raises(PackageError) as raised:
        import_model(repo / "m", tmp_path / "out")
    assert raised.value.param == param, raised.value.message
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert import_model(repo / "good", tmp_path / "out")["name"] == "good"


def test_bad_arguments_are_refused_naming_them(tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "good", SCALE_CONFIG, SCALE)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(InvalidArgument) as raised:
        import_model(repo / "good", tmp_path / "full")
    assert raised.value.param == "--output"
    with pytest.raises(PackageError) as raised:
        import_model(tmp_path / "full", tmp_path / "new")
    assert raised.value.param == "source"
    assert main(["import", str(repo / "nope"), "-o", str(tmp_path / "new")]) == 2
    assert "not a Triton model folder" in capsys.readouterr().err
    assert main(["import", str(repo / "good"), "-o", str(tmp_path / "new")]) == 0
