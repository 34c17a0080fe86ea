"""Announcing a LoRA adapter: checked against its announced base (by the injected store step),
refused naming `base` when the base is not announced, and recorded like any package."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.control.plane import ControlPlane
from podium.control.store import Store
from podium.errors import NotFound, PackageError
from podium.package.adapter import adapter_of
from podium.package.package import Package, write_manifest
from tests.support.fake_world import FakeWorld
from tests.support.lora_adapters import write_adapter_package


def _plane(tmp_path: Path, stored: list) -> tuple[ControlPlane, Store]:
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")

    def store_adapter(adapter: Package, base: Package) -> None:
        if base.manifest.lora is None:
            raise PackageError("base does not enable LoRA", param="base")
        stored.append((adapter.key, base.key))

    plane = ControlPlane(store, FakeWorld(), materialize=lambda _p: None,
                         materialize_adapter=store_adapter)
    return plane, store


def _base(folder: Path, lora: bool = True) -> Path:
    manifest = {"name": "llm", "version": "1", "backend": "vllm",
                "weights": {"source": "path", "path": "/nonexistent"}}
    write_manifest(folder, {**manifest, **({"lora": {}} if lora else {})})
    return folder


def test_an_adapter_is_stored_against_its_announced_base_and_recorded(tmp_path: Path) -> None:
    stored: list = []
    plane, store = _plane(tmp_path, stored)
    plane.announce(str(_base(tmp_path / "llm")))
    adapter = write_adapter_package(tmp_path / "tone", "tone", seed=1, base="llm@1", layers=1)
    assert plane.announce(str(adapter))["backend"] == "lora"
    assert stored == [("tone@1", "llm@1")]
    row = next(p for p in store.list_packages() if p.name == "tone")
    info = adapter_of(row.manifest)
    assert info is not None and (info.base_key, info.rank) == ("llm@1", 8)
    store.close()


def test_an_adapter_of_a_base_not_announced_is_refused_naming_base(tmp_path: Path) -> None:
    plane, store = _plane(tmp_path, [])
    adapter = write_adapter_package(tmp_path / "tone", "tone", seed=1, base="llm@1", layers=1)
    with pytest.raises(NotFound, match="base='llm@1' is not announced") as err:
        plane.announce(str(adapter))
    assert err.value.param == "base"
    assert not store.list_packages()
    plane.announce(str(_base(tmp_path / "llm", lora=False)))
    with pytest.raises(PackageError, match="does not enable LoRA"):
        plane.announce(str(adapter))
    assert [p.name for p in store.list_packages()] == ["llm"]
    store.close()
