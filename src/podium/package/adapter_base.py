"""An adapter checked against its base package, then stored: the one path `podium package`,
`podium materialize`, `podium announce` (the control plane) and `podium serve --repository`
take, so each refuses the same adapter with the same message."""

from __future__ import annotations

import logging
from pathlib import Path

from podium import env
from podium.errors import PackageError
from podium.package.adapter import AdapterInfo, adapter_of, check_files, check_fits_base
from podium.package.adapter_store import AdapterStore, StoredAdapter
from podium.package.manifest import MANIFEST_NAME, VllmManifest
from podium.package.package import Package, open_package

log = logging.getLogger("podium.package")


def info_of(package: Package) -> AdapterInfo:
    """The adapter a package is, or a PackageError naming `backend`."""
    info = adapter_of(package.manifest)
    if info is None:
        raise PackageError(f"{package.key} is not an adapter package (backend is "
                           f"{package.manifest.backend!r}, not \"lora\")", param="backend")
    return info


def check_against_base(adapter: Package, base: Package, *, materialize: bool = True
                       ) -> AdapterInfo:
    """Every check of `adapter` on its own and against `base` (its weights materialized into
    the cache first when they are not there yet, unless `materialize` is false: then the
    checks of the base's weights wait for announce)."""
    from podium.package.cache import ModelCache

    info = info_of(adapter)
    if base.key != info.base_key:
        raise PackageError(f"base={info.base_key!r} but the base given is {base.key}",
                           param="base")
    manifest = base.manifest
    if not isinstance(manifest, VllmManifest) or manifest.task != "generate":
        raise PackageError(f"base={info.base_key!r} is not a generative LLM package (backend "
                           f"{manifest.backend!r}); an adapter runs on a vllm LLM",
                           param="base")
    cache = ModelCache()
    weights = cache.lookup(base)
    if weights is None:
        if not materialize:
            log.info("%s: base %s is not materialized here; its weights are checked against "
                     "the adapter when announced", adapter.key, base.key)
            if manifest.lora is None or info.rank > manifest.lora.max_lora_rank:
                check_fits_base(check_files(adapter.root, adapter.manifest), info,
                                manifest.lora, Path("/nonexistent"))
            return info
        weights = cache.materialize(base).path
    check_fits_base(check_files(adapter.root, adapter.manifest), info, manifest.lora, weights)
    return info


def store_adapter(adapter: Package, base: Package) -> StoredAdapter:
    """Check the adapter against `base`, then put it in the cache where instances of the base
    find it."""
    check_against_base(adapter, base)
    return AdapterStore().materialize(adapter)


def local_base(info: AdapterInfo) -> Package | None:
    """The base as this machine keeps it outside a control plane: the package written under
    $PODIUM_HOME/packages/<name> (the default model's), when its version matches."""
    folder = env.home() / "packages" / info.base_name
    if not (folder / MANIFEST_NAME).is_file():
        return None
    try:
        base = open_package(folder)
    except PackageError:
        return None
    return base if base.key == info.base_key else None


def check_against_local_base(adapter: Package) -> None:
    """`podium package`: the checks against the base where this machine has it; without it,
    the adapter's own checks (already run) and a log line saying what waits for announce."""
    info = info_of(adapter)
    base = local_base(info)
    if base is None:
        log.info("%s: base %s is not on this machine; it is checked against the base when "
                 "announced", adapter.key, info.base_key)
        return
    check_against_base(adapter, base, materialize=False)
