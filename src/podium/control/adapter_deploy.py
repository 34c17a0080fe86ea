"""Deploying LoRA adapters and the bases that carry them: the checks a rollout starts with,
and which models are adapters (for the world that places them).

`podium deploy support-tone@2` is a rollout like any other, but its `Scale`s are placements on
the base's instances (`adapters`), so it needs the base running first: the base deployed in
the region, at the version the adapter was trained on. A rollout of the base itself carries
the placed adapters over to its new version, or is refused naming the ones that do not fit.
"""

from __future__ import annotations

from collections.abc import Callable

from podium.control.adapters import AdapterInfo, adapter_of, misfit
from podium.control.models import PackageRow
from podium.control.rollout_config import RolloutConfig
from podium.control.store import Store
from podium.errors import Conflict, InvalidArgument, PackageError
from podium.package.package import Package, open_package


def adapter_of_row(row: PackageRow) -> AdapterInfo | None:
    """The adapter an announced package is (None: a model with instances of its own)."""
    return adapter_of(row.manifest)


def check_adapter_deploy(store: Store, name: str, version: str, adapter: AdapterInfo,
                         config: RolloutConfig, regions: list[str]) -> RolloutConfig:
    """Refuse an adapter rollout whose base does not run as it needs in every region, or that
    asks for instances of its own (it has one placement per version); the config it runs
    with."""
    key = f"{name}@{version}"
    base = adapter.base_name
    if config.num_instances != 1:
        raise InvalidArgument(f"num_instances={config.num_instances}: {key} is a LoRA adapter, "
                              f"it runs on every instance of {base} and has none of its own; "
                              f"scale {base} instead (`podium scale {base}@VERSION`)",
                              param="num_instances")
    for region in regions:
        where = "" if regions == ["default"] else f" in region {region}"
        deployed = _running_versions(store, base, region)
        if not deployed:
            raise Conflict(f"{key} is a LoRA adapter of {adapter.base_key}, and {base} is not "
                           f"deployed{where}: deploy the base first (`podium deploy "
                           f"{adapter.base_key}`)", param="model")
        if adapter.base_version not in deployed:
            raise Conflict(f"{key} is a LoRA adapter of {adapter.base_key}, but {base} runs "
                           f"version {', '.join(sorted(deployed))}{where}: package the "
                           f"adapter for the running base (\"base\": \"{base}@"
                           f"{max(deployed, key=_order)}\") or deploy {adapter.base_key}",
                           param="version")
        for other in sorted(deployed - {adapter.base_version}, key=_order):
            why = misfit(adapter, other, store.get_package(base, other).manifest)
            if why is not None:  # every running base version serves its placed adapters
                raise Conflict(f"{key} cannot be placed on {base}@{other}, which also "
                               f"runs{where}: {why}", param="version")
    return config


def check_base_carries(store: Store, model: str, version: str, regions: list[str]) -> None:
    """Refuse a rollout of a base to `version` when adapters placed on it do not fit it,
    naming each with the reason; they are carried over otherwise."""
    adapters = placed_adapters(store, model, regions)
    if not adapters:
        return
    manifest = store.get_package(model, version).manifest
    unfit = [f"{key} ({why})" for key, adapter in sorted(adapters.items())
             if (why := misfit(adapter, version, manifest)) is not None]
    if unfit:
        raise Conflict(f"{model}@{version} cannot carry the LoRA adapters placed on {model}: "
                       f"{'; '.join(unfit)}. Roll those adapters out to versions that fit "
                       f"{model}@{version} first, or stop them (`podium scale ADAPTER@VERSION "
                       "--min 0 --max 0`)", param="version")


def carry_adapters(store: Store, model: str, version: str, regions: list[str],
                   carry: Callable[[Package, Package], object]) -> list[str]:
    """Before a rollout of a base to `version`: each adapter placed on the base, checked
    against the new version's weights and stored for its instances (`carry`); Conflict naming
    every one that does not fit. Returns the adapters carried (`name@version`)."""
    adapters = placed_adapters(store, model, regions)
    if not adapters:
        return []
    check_base_carries(store, model, version, regions)  # the manifests' verdict first
    base = open_package(store.get_package(model, version).location)
    unfit = []
    for key, adapter in sorted(adapters.items()):
        try:
            carry(open_package(store.get_package(adapter.name, adapter.version).location), base)
        except PackageError as exc:
            unfit.append(f"{key} ({exc.message})")
    if unfit:
        raise Conflict(f"{model}@{version} cannot carry the LoRA adapters placed on {model}: "
                       f"{'; '.join(unfit)}", param="version")
    return sorted(adapters)


def placed_adapters(store: Store, base: str, regions: list[str]) -> dict[str, AdapterInfo]:
    """`name@version` → adapter, for every adapter version placed on `base` in `regions`."""
    rows = {(p.name, p.version): p for p in store.list_packages()}
    found: dict[str, AdapterInfo] = {}
    for dep in store.list_deployments():
        row = rows.get((dep.model, dep.version))
        if dep.region not in regions or dep.num_desired == 0 or row is None:
            continue
        adapter = adapter_of_row(row)
        if adapter is not None and adapter.base_name == base:
            found[f"{dep.model}@{dep.version}"] = adapter
    return found


def adapter_bases(store: Store) -> dict[str, str]:
    """Adapter name → its base model's name, for every announced adapter."""
    found: dict[str, str] = {}
    for row in store.list_packages():
        adapter = adapter_of_row(row)
        if adapter is not None:
            found[row.name] = adapter.base_name
    return found


class AdapterIndex:
    """Which model names are LoRA adapters, and of which base (read from the announced
    packages; an adapter's name stays an adapter's)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._bases: dict[str, str | None] = {}

    def base_of(self, model: str) -> str | None:
        """The base model of adapter `model`; None for a model with instances of its own."""
        if model not in self._bases:
            rows = [p for p in self.store.list_packages() if p.name == model]
            if not rows:
                return None  # not announced (yet): asked again next time
            adapter = adapter_of_row(rows[-1])
            self._bases[model] = adapter.base_name if adapter else None
        return self._bases[model]


def _running_versions(store: Store, model: str, region: str) -> set[str]:
    return {d.version for d in store.list_deployments(model, region=region)
            if d.num_desired > 0}


def _order(version: str) -> tuple[int, str]:
    return (int(version), version) if version.isdigit() else (1 << 62, version)
