"""A LoRA adapter carried over to a new version of its base (a base rollout): checked against
that version's weights, then found by its instances under their own base key."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from podium.errors import PackageError
from podium.package.adapter_carry import carry_adapter
from podium.package.adapter_store import AdapterStore
from podium.package.cache import ModelCache
from podium.package.package import open_package, write_manifest
from tests.support.lora_adapters import HEAD_DIM, HEADS, HIDDEN, KV_HEADS, write_adapter_package

MODEL = "smollm2-135m-instruct"


def _weights(folder: Path, *, hidden: int) -> Path:
    """One layer's attention weights as the fit check reads them: a safetensors header."""
    shapes = {"model.layers.0.self_attn.q_proj.weight": [HEADS * HEAD_DIM, hidden],
              "model.layers.0.self_attn.v_proj.weight": [KV_HEADS * HEAD_DIM, hidden],
              "model.layers.0.self_attn.o_proj.weight": [hidden, HEADS * HEAD_DIM]}
    header = json.dumps({name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}
                         for name, shape in shapes.items()}).encode()
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PODIUM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _base(tmp_path: Path, version: str, hidden: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Base `version`, its weights already materialized (as a deployed base's are)."""
    weights = _weights(tmp_path / f"weights-{version}", hidden=hidden)
    package = write_manifest(tmp_path / f"base-{version}", {
        "name": MODEL, "version": version, "backend": "vllm", "lora": {},
        "weights": {"source": "path", "path": str(weights)}}).root
    looked_up = ModelCache.lookup
    monkeypatch.setattr(ModelCache, "lookup", lambda self, p: (
        weights if p.key == f"{MODEL}@{version}" else looked_up(self, p)))
    return package


def test_a_carried_adapter_is_found_by_the_new_base_versions_instances(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = open_package(write_adapter_package(
        tmp_path / "tone", "tone", seed=1, layers=1, modules=("q_proj", "v_proj")))
    new_base = open_package(_base(tmp_path, "2", HIDDEN, monkeypatch))
    stored = carry_adapter(adapter, new_base)
    assert stored.info.base_key == f"{MODEL}@2"
    found = AdapterStore(cache).find(f"{MODEL}@2", "tone", "1")
    assert found is not None and (found.path / "adapter_model.safetensors").is_file()
    # still its own base's too: instances of version 1 keep serving it during the rollout
    assert AdapterStore(cache).find(f"{MODEL}@1", "tone", "1") is not None


def test_an_adapter_that_does_not_fit_the_new_version_is_refused_and_not_stored(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = open_package(write_adapter_package(
        tmp_path / "tone", "tone", seed=1, layers=1, modules=("q_proj", "v_proj")))
    wider = open_package(_base(tmp_path, "2", HIDDEN * 2, monkeypatch))
    with pytest.raises(PackageError, match=r"q_proj.lora_A.weight has input width 576 but "
                                           rf"model.layers.0.self_attn.q_proj of base "
                                           rf"{MODEL}@2 has 1152: the adapter was trained for "
                                           "another architecture"):
        carry_adapter(adapter, wider)
    assert AdapterStore(cache).find(f"{MODEL}@2", "tone") is None
