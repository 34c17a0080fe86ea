"""The packages of a repository directory (`podium serve --repository DIR`)."""

from __future__ import annotations

from pathlib import Path

from podium.errors import PackageError
from podium.package.manifest import MANIFEST_NAME
from podium.package.package import Package, open_package
from podium.repository.policy import version_key
from podium.triton.scan import is_triton_model, model_packages, scan_triton


def scan_repository(directory: Path, failures: dict[tuple[str, str], str] | None = None
                    ) -> list[Package]:
    """Packages in a repository directory: `DIR/*/podium.json`, `DIR/*/*/podium.json`
    (name/version layout), `DIR/*.tar.gz` and Triton models (`DIR/*/config.pbtxt`), sorted by
    name then version. A Triton model that cannot be served is left out, its reason put in
    `failures` by (name, version)."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise PackageError(f"{directory}: the model repository must be a directory")
    locations = sorted({*directory.glob(f"*/{MANIFEST_NAME}"),
                        *directory.glob(f"*/*/{MANIFEST_NAME}")})
    packages = [open_package(path.parent) for path in locations]
    packages += [open_package(path) for path in sorted(directory.glob("*.tar.gz"))]
    triton, broken = scan_triton(directory)
    packages += triton
    if failures is not None:
        failures.update(broken)
    seen: dict[str, Package] = {}
    for package in packages:
        if package.key in seen:
            first = seen[package.key].root
            raise PackageError(f"{directory}: {package.key} is packaged twice ({first} and "
                               f"{package.root}); remove one")
        seen[package.key] = package
    return sorted(packages, key=lambda p: (p.manifest.name, version_key(p.manifest.version)))


def open_served(location: Path) -> list[Package]:
    """What `podium serve LOCATION` serves: a Podium package, or a Triton model folder (the
    versions its policy picks; an announced Triton version is such a folder, see
    `triton/snapshot.py`)."""
    path = Path(location).expanduser()
    if path.is_dir() and is_triton_model(path) and not (path / MANIFEST_NAME).exists():
        return list(model_packages(path))
    return [open_package(path)]
