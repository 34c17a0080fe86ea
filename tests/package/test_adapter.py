"""LoRA adapter packages: what one is, every way one is refused (naming the field), and the
cache's adapter index an instance reads per request."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from podium.errors import PackageError
from podium.package import adapter as adapter_module
from podium.package.adapter import adapter_of, check_files, check_fits_base
from podium.package.adapter_store import AdapterStore
from podium.package.lora_manifest import LoraSettings
from podium.package.manifest import parse_manifest
from podium.package.package import build_package, open_package
from tests.support.lora_adapters import (
    HEAD_DIM,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    write_adapter_package,
)

BASE = "smollm2-135m-instruct@1"


def _fake_base(folder: Path, *, hidden: int = HIDDEN, vocab: int = 49152,
               layers: int = LAYERS) -> Path:
    """A base's weights as far as the checks read them: a safetensors header of shapes."""
    shapes: dict[str, list[int]] = {"model.embed_tokens.weight": [vocab, hidden]}
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        shapes.update({f"{prefix}.self_attn.q_proj.weight": [HEADS * HEAD_DIM, hidden],
                       f"{prefix}.self_attn.k_proj.weight": [KV_HEADS * HEAD_DIM, hidden],
                       f"{prefix}.self_attn.v_proj.weight": [KV_HEADS * HEAD_DIM, hidden],
                       f"{prefix}.self_attn.o_proj.weight": [hidden, HEADS * HEAD_DIM],
                       f"{prefix}.mlp.gate_proj.weight": [INTERMEDIATE, hidden],
                       f"{prefix}.mlp.up_proj.weight": [INTERMEDIATE, hidden],
                       f"{prefix}.mlp.down_proj.weight": [hidden, INTERMEDIATE],
                       f"{prefix}.input_layernorm.weight": [hidden]})
    header = json.dumps({name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}
                         for name, shape in shapes.items()}).encode()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


def _adapter(tmp_path: Path, name: str = "tone", **kwargs: Any) -> Path:
    return write_adapter_package(tmp_path / name, name, seed=1, layers=2, **kwargs)


def _fits(folder: Path, base: Path, lora: LoraSettings | None = LoraSettings()) -> None:
    package = open_package(folder)
    info = adapter_of(package.manifest)
    assert info is not None
    check_fits_base(check_files(package.root, package.manifest), info, lora, base)


def test_adapter_of_reads_base_and_rank_from_the_manifest_or_its_stored_json() -> None:
    data = {"name": "tone", "version": "2", "backend": "lora", "base": BASE, "rank": 8}
    info = adapter_of(parse_manifest(data))
    assert info is not None and adapter_of(data) == info
    assert (info.key, info.base_name, info.base_version, info.rank) == (
        "tone@2", "smollm2-135m-instruct", "1", 8)
    assert adapter_of({"name": "m", "backend": "vllm"}) is None


def test_a_good_adapter_fits_its_base_and_packs(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))  # no base on this machine
    folder = _adapter(tmp_path)
    _fits(folder, _fake_base(tmp_path / "base"))
    build_package(folder, tmp_path / "tone.tar.gz")  # the base is not on this machine: own checks
    assert open_package(tmp_path / "tone.tar.gz").manifest.backend == "lora"


@pytest.mark.parametrize(("manifest", "field", "words"), [
    pytest.param({"base": "smollm2"}, "base", "name@version", id="base-without-version"),
    pytest.param({"rank": 0}, "rank", "greater than or equal", id="rank-zero"),
    pytest.param({"path": "../elsewhere"}, "path", "outside the package", id="path-leaves"),
])
def test_bad_manifests_name_the_field(tmp_path: Path, manifest: dict[str, Any], field: str,
                                      words: str) -> None:
    folder = _adapter(tmp_path, manifest=manifest)
    with pytest.raises(PackageError) as err:
        open_package(folder)
    assert err.value.param == field and words in err.value.message


@pytest.mark.parametrize(("change", "field", "words"), [
    pytest.param(lambda f: (f / "adapter_model.safetensors").unlink(), "path",
                 "adapter_model.safetensors is missing", id="missing-weights"),
    pytest.param(lambda f: (f / "adapter_config.json").unlink(), "path",
                 "adapter_config.json is missing", id="missing-config"),
    pytest.param(lambda f: (f / "adapter_model.safetensors").write_bytes(b"junk"), "path",
                 "not a safetensors file", id="not-safetensors"),
    pytest.param(lambda f: _edit_config(f, r=4), "rank", "r=4", id="rank-differs-from-r"),
    pytest.param(lambda f: _edit_config(f, peft_type="IA3"), "path", "only LoRA",
                 id="not-lora"),
    pytest.param(lambda f: _edit_config(f, use_dora=True), "path", "DoRA", id="dora"),
    pytest.param(lambda f: _edit_config(f, modules_to_save=["lm_head"]), "target_modules",
                 "modules_to_save", id="modules-to-save"),
])
def test_bad_files_are_refused_naming_the_field(tmp_path: Path, change: Any, field: str,
                                                words: str) -> None:
    folder = _adapter(tmp_path)
    change(folder)
    with pytest.raises(PackageError) as err:
        open_package(folder)
    assert err.value.param == field and words in err.value.message


def test_oversized_weights_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _adapter(tmp_path)
    monkeypatch.setattr(adapter_module, "MAX_WEIGHTS_BYTES", 1000)
    with pytest.raises(PackageError, match="over the 1000 byte limit") as err:
        open_package(folder)
    assert err.value.param == "path"


def test_a_link_to_weights_outside_the_package_is_refused(tmp_path: Path) -> None:
    folder = _adapter(tmp_path)
    outside = tmp_path / "outside.safetensors"
    (folder / "adapter_model.safetensors").rename(outside)
    (folder / "adapter_model.safetensors").symlink_to(outside)
    with pytest.raises(PackageError, match=r"outside|leaves|inside"):
        open_package(folder)


@pytest.mark.parametrize(("kwargs", "lora", "field", "words"), [
    pytest.param({"modules": ("q_proj",)}, None, "base", "does not enable LoRA",
                 id="base-without-lora"),
    pytest.param({"rank": 32, "modules": ("q_proj",)}, LoraSettings(max_lora_rank=16), "rank",
                 "above the max_lora_rank=16", id="rank-above-max"),
    pytest.param({"modules": ("q_proj", "c_attn")}, LoraSettings(), "target_modules",
                 "['c_attn'] are not modules", id="module-the-base-lacks"),
])
def test_adapters_the_base_cannot_serve_are_refused(tmp_path: Path, kwargs: dict[str, Any],
                                                   lora: LoraSettings | None, field: str,
                                                   words: str) -> None:
    widths = {"q_proj": (HIDDEN, HEADS * HEAD_DIM), "c_attn": (HIDDEN, 3 * HIDDEN),
              "v_proj": (HIDDEN, KV_HEADS * HEAD_DIM)}
    folder = _adapter(tmp_path, widths=widths, **kwargs)
    with pytest.raises(PackageError) as err:
        _fits(folder, _fake_base(tmp_path / "base"), lora)
    assert err.value.param == field and words in err.value.message


def test_an_adapter_of_another_architecture_is_refused_by_its_widths(tmp_path: Path) -> None:
    folder = _adapter(tmp_path)
    with pytest.raises(PackageError, match=r"(input|output) width 576 but .* has 768") as err:
        _fits(folder, _fake_base(tmp_path / "base", hidden=768))
    assert err.value.param == "target_modules"


def test_an_adapter_of_a_deeper_model_is_refused(tmp_path: Path) -> None:
    folder = write_adapter_package(tmp_path / "deep", "deep", seed=1, layers=3)
    with pytest.raises(PackageError, match=r"targets model\.layers\.2\..*, which base"):
        _fits(folder, _fake_base(tmp_path / "base", layers=2))


def test_an_adapter_of_another_vocabulary_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    folder = _adapter(tmp_path)
    weights = folder / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    import numpy as np

    tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = np.ones((8, 32000),
                                                                              np.float32)
    tensors["base_model.model.model.embed_tokens.lora_embedding_B"] = np.ones((HIDDEN, 8),
                                                                              np.float32)
    save_file(tensors, str(weights))
    with pytest.raises(PackageError, match=r"vocabulary 32000 but .* has 49152"):
        _fits(folder, _fake_base(tmp_path / "base"))


def test_the_store_finds_a_version_the_highest_one_and_lists_by_base(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "cache")
    for version, seed in (("1", 1), ("2", 2), ("10", 3)):
        store.materialize(open_package(write_adapter_package(
            tmp_path / f"tone-{version}", "tone", version=version, seed=seed, layers=1)))
    store.materialize(open_package(write_adapter_package(tmp_path / "other", "other",
                                                         seed=4, layers=1)))
    two = store.find(BASE, "tone", "2")
    assert two is not None and (two.path / "adapter_model.safetensors").is_file()
    latest = store.find(BASE, "tone")
    assert latest is not None and latest.info.version == "10"
    assert store.find(BASE, "tone", "3") is None and store.find(BASE, "nope") is None
    assert store.find("another-base@1", "tone") is None
    assert [a.info.key for a in store.list_for(BASE)] == ["other@1", "tone@1", "tone@2",
                                                         "tone@10"]
    assert store.remove(BASE, "tone", "10") and not store.remove(BASE, "tone", "10")
    latest = store.find(BASE, "tone")
    assert latest is not None and latest.info.version == "2"


def test_the_same_adapter_under_two_names_is_stored_once(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "cache")
    first = store.materialize(open_package(write_adapter_package(tmp_path / "a", "a", seed=1,
                                                                 layers=1)))
    second = store.materialize(open_package(write_adapter_package(tmp_path / "b", "b", seed=1,
                                                                  layers=1)))
    assert first.path == second.path


def test_lora_settings_refuse_what_vllm_would(tmp_path: Path) -> None:
    llm = {"name": "m", "backend": "vllm", "weights": {"source": "package", "path": "w"}}
    with pytest.raises(PackageError, match="max_lora_rank=24 is not a rank vLLM serves"):
        parse_manifest({**llm, "lora": {"max_lora_rank": 24}})
    with pytest.raises(PackageError, match=r"max_cpu_loras=2 is below lora\.max_loras=4"):
        parse_manifest({**llm, "lora": {"max_loras": 4, "max_cpu_loras": 2}})
    with pytest.raises(PackageError, match="move it there"):
        parse_manifest({**llm, "engine_args": {"enable_lora": True}})


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
