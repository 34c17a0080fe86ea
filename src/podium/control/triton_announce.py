"""Announcing one model of a Triton repository (`podium announce ./repo/my_model`).

Each numbered version folder becomes a Podium version of the same number (`my_model/2` →
`my_model@2`), copied into a snapshot under $PODIUM_HOME/triton (`triton/snapshot.py`) that
the instances serve as a one-version Triton model folder. Versions already announced are
skipped, so adding folder `3` and announcing again announces only `my_model@3`. Every new
version is checked (its config and its package) before any is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from podium import env
from podium.control.store import Store
from podium.errors import Conflict
from podium.package.package import Package
from podium.triton.scan import model_packages
from podium.triton.snapshot import TritonModelFolder, check_announceable, snapshot_version


def announce_triton(store: Store, folder: TritonModelFolder,
                    materialize: Callable[[Package], None]) -> dict[str, Any]:
    """Snapshot, check, materialize and record the new versions of a Triton model."""
    root = folder.root
    check_announceable(root)
    name = root.name
    announced = {p.version for p in store.list_packages() if p.name == name}
    skipped = [v for v in folder.versions if v in announced]
    new = [v for v in folder.versions if v not in announced]
    if not new:
        raise Conflict(f"{name}: version{'s' if len(skipped) > 1 else ''} "
                       f"{', '.join(skipped)} already announced; add a numbered version "
                       f"folder (e.g. {root}/{int(skipped[-1]) + 1}) and announce again",
                       param="version")
    packages = []
    for version in new:  # every version checked before any is recorded
        snapshot = snapshot_version(root, version, env.home() / "triton")
        (package,) = model_packages(snapshot)
        packages.append(package)
    rows = []
    for package in packages:
        materialize(package)
        manifest = package.manifest
        store.announce_package(manifest.name, manifest.version, manifest.backend,
                               str(package.root), manifest.model_dump(mode="json"))
        rows.append({"version": manifest.version, "location": str(package.root)})
    return {"name": name, "triton_model": str(root), "backend": packages[0].backend_name,
            "announced": rows, "skipped": skipped}


def triton_folder(location: str) -> TritonModelFolder | None:
    """The Triton model (folder or one version folder) `location` names, if it is one."""
    from podium.triton.snapshot import model_folder_of

    return model_folder_of(Path(location))
