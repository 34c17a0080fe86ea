"""A LoRA adapter carried over to another version of its base (a base rollout): checked
against that version's weights as at announce, then indexed under it in the cache, so the new
version's instances serve it without a new adapter package."""

from __future__ import annotations

from dataclasses import replace

from podium.errors import PackageError
from podium.package.adapter import check_files, check_fits_base
from podium.package.adapter_base import info_of
from podium.package.adapter_store import AdapterStore, StoredAdapter
from podium.package.manifest import VllmManifest
from podium.package.package import Package


def carry_adapter(adapter: Package, base: Package) -> StoredAdapter:
    """Check `adapter` (made for another version of `base`'s model) against `base`, then
    store it where `base`'s instances find it; PackageError naming the field when it does
    not fit (rank, target modules, widths of another architecture or vocabulary)."""
    from podium.package.cache import ModelCache

    info = info_of(adapter)
    if info.base_name != base.manifest.name:
        raise PackageError(f"{adapter.key} is an adapter of {info.base_name}, not of "
                           f"{base.manifest.name}", param="base")
    manifest = base.manifest
    if not isinstance(manifest, VllmManifest) or manifest.task != "generate":
        raise PackageError(f"{base.key} is not a generative LLM package", param="base")
    carried = replace(info, base_version=manifest.version)
    cache = ModelCache()
    weights = cache.lookup(base) or cache.materialize(base).path
    check_fits_base(check_files(adapter.root, adapter.manifest), carried, manifest.lora, weights)
    store = AdapterStore()
    return store.carry(store.materialize(adapter), base.key)
