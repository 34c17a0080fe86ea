"""config.pbtxt → ModelConfig, the allow-list of honoured fields, versions, the manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.errors import PackageError
from podium.triton.config import check_supported, read_config
from podium.triton.scan import model_packages, scan_triton
from tests.support.triton_layouts import ONNX_CONFIG, SCALE, SCALE_CONFIG, write_model


def _config(tmp_path: Path, text: str):
    path = tmp_path / "config.pbtxt"
    path.write_text(text)
    return read_config(path)


@pytest.mark.parametrize("extra, field", [
    ("sequence_batching { iterative_sequence: true }", "sequence_batching.iterative_sequence"),
    ('sequence_batching { state [ { input_name: "S" } ] }', "sequence_batching.state"),
    ("sequence_batching { direct { max_queue_delay_microseconds: 5 } }",
     "sequence_batching.direct.max_queue_delay_microseconds"),
    ("dynamic_batching { priority_levels: 2 }", "dynamic_batching.priority_levels"),
    ("dynamic_batching { default_queue_policy { default_timeout_microseconds: 5 } }",
     "dynamic_batching.default_queue_policy.default_timeout_microseconds"),
    ('input [ { name: "Z" data_type: TYPE_FP32 dims: [1] format: FORMAT_NCHW } ]',
     "input.format"),
    ("model_warmup [ { name: \"w\" } ]", "model_warmup"),
])
def test_a_field_not_honoured_is_refused_by_name(tmp_path, extra, field):
    config = _config(tmp_path, SCALE_CONFIG + extra)
    with pytest.raises(PackageError) as caught:
        check_supported(config, "where")
    assert caught.value.param == field and repr(field) in caught.value.message


def test_honoured_fields_pass(tmp_path):
    check_supported(_config(tmp_path, ONNX_CONFIG), "where")


def test_versions_and_manifest(tmp_path):
    write_model(tmp_path, "scale", SCALE_CONFIG + "version_policy { latest { num_versions: 2 } }"
                "\ndynamic_batching { max_queue_delay_microseconds: 100 }", SCALE,
                versions=("1", "3", "10"))
    packages = model_packages(tmp_path / "scale")
    assert [p.manifest.version for p in packages] == ["3", "10"]
    manifest = packages[0].manifest
    assert manifest.max_batch_size == 8 and manifest.dynamic_batching.max_queue_delay_us == 100
    assert [(s.name, s.datatype, s.shape) for s in manifest.inputs] == [("RAW", "FP32", [3])]
    assert packages[0].backend_name == "triton-python"


def test_a_refused_model_does_not_hide_the_others(tmp_path):
    write_model(tmp_path, "scale", SCALE_CONFIG, SCALE)
    write_model(tmp_path, "other", SCALE_CONFIG.replace("backend: \"python\"", 'name: "x"'))
    write_model(tmp_path, "noversion", SCALE_CONFIG, SCALE, versions=())
    packages, failures = scan_triton(tmp_path)
    assert [p.key for p in packages] == ["scale@1"]
    assert "name='x' differs" in failures[("other", "")]
    assert "no numbered version folder" in failures[("noversion", "")]


def test_a_name_podium_refuses_is_named(tmp_path):
    write_model(tmp_path, "Scale", SCALE_CONFIG, SCALE)
    _, failures = scan_triton(tmp_path)
    assert "name" in failures[("Scale", "")] and "\n" not in failures[("Scale", "")]


def test_a_batching_value_past_podiums_bound_is_a_load_error_naming_it(tmp_path):
    write_model(tmp_path, "slow", SCALE_CONFIG
                + "\ndynamic_batching { max_queue_delay_microseconds: 5000000 }", SCALE)
    write_model(tmp_path, "scale", SCALE_CONFIG, SCALE)
    packages, failures = scan_triton(tmp_path)
    assert [p.key for p in packages] == ["scale@1"]  # the good model still loads
    [reason] = [r for (name, _), r in failures.items() if name == "slow"]
    assert "dynamic_batching" in reason and "max_queue_delay_us" in reason, reason
