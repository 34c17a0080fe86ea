"""Triton's vLLM backend layout (`1/model.json`) mapped onto Podium's vLLM manifest (no engine
is started here: the mapping only)."""

from __future__ import annotations

import json

import pytest

from podium.errors import PackageError
from podium.triton.scan import model_packages, scan_triton
from tests.support.triton_layouts import write_model

VLLM_CONFIG = '''
backend: "vllm"
instance_group [ { count: 1 kind: KIND_MODEL } ]
model_transaction_policy { decoupled: true }
'''


def _write(tmp_path, args):
    write_model(tmp_path, "llm", VLLM_CONFIG)
    (tmp_path / "llm" / "1" / "weights").mkdir()
    (tmp_path / "llm" / "1" / "model.json").write_text(json.dumps(args))
    return tmp_path / "llm"


def test_model_json_becomes_a_vllm_manifest(tmp_path):
    root = _write(tmp_path, {"model": "weights", "max_model_len": 512,
                             "disable_log_requests": True})
    (package,) = model_packages(root)
    manifest = package.manifest
    assert package.backend_name == "vllm" and manifest.backend == "vllm"
    assert manifest.weights.source == "package" and manifest.weights.path == "1/weights"
    assert manifest.engine_args == {"max_model_len": 512}


def test_absolute_weights_path(tmp_path):
    (package,) = model_packages(_write(tmp_path, {"model": "/models/llm"}))
    assert package.manifest.weights.source == "path"


@pytest.mark.parametrize("args, field", [
    ({"model": "facebook/opt-125m"}, "model.json:model"),
    ({"model": "weights", "max_num_queued_reqs": 3}, "model.json"),
    ({"max_model_len": 3}, "model.json"),
])
def test_refused_model_json(tmp_path, args, field):
    with pytest.raises(PackageError) as caught:
        model_packages(_write(tmp_path, args))
    assert caught.value.param == field


def test_unknown_tensor_is_refused(tmp_path):
    _write(tmp_path, {"model": "weights"})
    config = tmp_path / "llm" / "config.pbtxt"
    config.write_text(VLLM_CONFIG + 'input [ { name: "prompt" data_type: TYPE_STRING '
                      'dims: [1] } ]')
    _, failures = scan_triton(tmp_path)
    assert "'prompt' is not one of Triton's vLLM backend tensors" in failures[("llm", "")]
