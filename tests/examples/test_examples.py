"""`podium examples create DIR` writes a repository every backend can serve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.examples import create_examples
from podium.repository import scan_repository


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("examples")
    create_examples(target)
    return target


def test_every_example_is_a_valid_package(repository: Path) -> None:
    packages = {p.manifest.name: p for p in scan_repository(repository)}
    assert {name: p.manifest.backend for name, p in packages.items()} == {
        "xgb-example": "xgboost", "torch-example": "torch", "onnx-example": "onnx",
        "python-example": "python", "smollm2-135m-instruct": "vllm", "recommend": "pipeline"}
    for package in packages.values():
        for attr in ("model_file", "module"):
            if hasattr(package.manifest, attr):
                assert (package.root / getattr(package.manifest, attr)).is_file()


def test_xgb_example_is_the_benchmark_model(repository: Path) -> None:
    import xgboost

    booster = xgboost.Booster(model_file=str(repository / "xgb-example" / "model.json"))
    assert booster.num_features() == 20
    assert booster.num_boosted_rounds() == 100
    trees = json.loads(booster.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]
    assert max(int(t["tree_param"]["num_nodes"]) for t in trees) > 31  # deeper than 4
    config = json.loads(booster.save_config())
    assert config["learner"]["gradient_booster"]["tree_train_param"]["max_depth"] == "6"


def test_python_example_is_an_ensemble_over_xgb(repository: Path) -> None:
    manifest = json.loads((repository / "python-example" / "podium.json").read_text())
    assert manifest["parameters"]["scorer"] == "xgb-example"
    assert "self.models.infer(self.scorer" in (repository / "python-example" /
                                               "model.py").read_text()


def test_llm_example_uses_the_default_manifest(repository: Path) -> None:
    from podium.package.defaults import default_llm_manifest

    written = json.loads((repository / "smollm2-135m-instruct" / "podium.json").read_text())
    expected = default_llm_manifest()
    assert written["name"] == expected["name"] == "smollm2-135m-instruct"
    assert written["weights"] == expected["weights"]
    assert written["engine_args"] == expected["engine_args"]


def test_creating_twice_overwrites_cleanly(tmp_path: Path) -> None:
    first = create_examples(tmp_path)
    second = create_examples(tmp_path)
    assert first == second
    assert len(scan_repository(tmp_path)) == 6
