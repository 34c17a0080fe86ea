"""The podium.json schema: valid manifests load, invalid ones name the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.engine import ENGINE_VERSION
from podium.errors import EngineVersionMismatch, PackageError
from podium.package.manifest import manifest_json_schema, parse_manifest

ROOT = Path(__file__).resolve().parents[2]
LLM = {"name": "m", "backend": "vllm", "weights": {"source": "package", "path": "w"}}


def test_vllm_manifest_defaults() -> None:
    manifest = parse_manifest(LLM)
    assert manifest.version == "1"
    assert manifest.task == "generate"
    assert manifest.engine_args == {}


def test_integer_version_is_accepted_as_string() -> None:
    assert parse_manifest({**LLM, "version": 3}).version == "3"


def test_pinned_engine_version_is_accepted() -> None:
    assert parse_manifest({**LLM, "engine_version": ENGINE_VERSION}).engine_version


def test_other_engine_version_is_rejected_naming_both() -> None:
    with pytest.raises(EngineVersionMismatch) as err:
        parse_manifest({**LLM, "engine_version": "0.6.0"})
    assert "0.6.0" in err.value.message and ENGINE_VERSION in err.value.message


@pytest.mark.parametrize(("data", "field", "fix"), [
    pytest.param({**LLM, "backend": "tensorrt"}, "backend", "one of", id="unknown-backend"),
    pytest.param({k: v for k, v in LLM.items() if k != "backend"}, "backend", "required",
                 id="missing-backend"),
    pytest.param({**LLM, "name": "Bad Name!"}, "name", "pattern", id="bad-name"),
    pytest.param({k: v for k, v in LLM.items() if k != "weights"}, "weights", "required",
                 id="missing-weights"),
    pytest.param({**LLM, "weights": {"source": "s3", "path": "x"}}, "weights", "source",
                 id="unknown-weights-source"),
    pytest.param({**LLM, "colour": "red"}, "colour", "not a known field", id="unknown-field"),
    pytest.param({**LLM, "engine_args": {"model": "x"}}, "engine_args", "set by Podium",
                 id="engine-args-override-model"),
    pytest.param({"name": "x", "backend": "xgboost", "max_batch_size": -1}, "max_batch_size",
                 "greater than or equal", id="negative-batch"),
    pytest.param({"name": "x", "backend": "python", "inputs": [{"name": "a", "datatype":
                 "FP33", "shape": [1]}]}, "inputs.0.datatype", "FP32", id="bad-datatype"),
])
def test_invalid_manifest_names_field_and_fix(data: dict, field: str, fix: str) -> None:
    with pytest.raises(PackageError) as err:
        parse_manifest(data)
    assert field in err.value.message
    assert fix in err.value.message


@pytest.mark.parametrize("data", [[], None, "x"], ids=["list", "null", "string"])
def test_manifest_must_be_an_object(data: object) -> None:
    with pytest.raises(PackageError, match="JSON object"):
        parse_manifest(data)


def test_published_schema_matches_the_code() -> None:
    published = json.loads((ROOT / "docs" / "manifest.schema.json").read_text())
    assert published == manifest_json_schema(), "run: podium schema > docs/manifest.schema.json"


def test_schema_validates_a_real_manifest() -> None:
    import jsonschema

    from podium.package.defaults import default_llm_manifest

    jsonschema.validate(default_llm_manifest(), manifest_json_schema())
