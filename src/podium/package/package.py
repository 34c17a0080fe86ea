"""A package on disk: a directory (or .tar.gz of one) holding podium.json plus files."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from podium import env
from podium.errors import PackageError
from podium.package.archive import pack, unpack
from podium.package.manifest import MANIFEST_NAME, Manifest, load_manifest, parse_manifest


@dataclass(frozen=True)
class Package:
    """A validated package, unpacked into `root`."""

    root: Path
    manifest: Manifest

    @property
    def key(self) -> str:
        """`name@version`, how the control plane and logs refer to it."""
        return f"{self.manifest.name}@{self.manifest.version}"


def open_package(location: Path | str) -> Package:
    """Open a package directory or safely unpack a .tar.gz package, then validate it."""
    path = Path(location).expanduser()
    if not path.exists():
        raise PackageError(f"{path}: no such package (a directory with {MANIFEST_NAME} "
                           "or a .tar.gz of one)")
    if path.is_dir():
        return Package(path.resolve(), load_manifest(path / MANIFEST_NAME))
    if path.name.endswith((".tar.gz", ".tgz", ".tar")):
        digest = _file_digest(path)[:16]
        target = env.home() / "unpacked" / digest
        if not (target / MANIFEST_NAME).is_file():
            staging = target.with_name(f"{digest}.partial")
            shutil.rmtree(staging, ignore_errors=True)
            unpack(path, staging)
            _promote(staging, target)
        return Package(target, load_manifest(target / MANIFEST_NAME))
    raise PackageError(f"{path}: a package is a directory or a .tar.gz file")


def build_package(source: Path, target: Path) -> Package:
    """`podium package`: validate the directory `source` and write it as a .tar.gz."""
    package = open_package(source)
    _check_files(package)
    pack(package.root, target)
    return package


def write_manifest(directory: Path, data: dict) -> Package:
    """Write podium.json into `directory` after validating it."""
    manifest = parse_manifest(data, where=str(directory / MANIFEST_NAME))
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2)  # as written by the author, once known to be valid
    (directory / MANIFEST_NAME).write_text(text + "\n")
    return Package(directory.resolve(), manifest)


def _check_files(package: Package) -> None:
    """Files the manifest names must be in the package."""
    manifest = package.manifest
    names: list[str] = []
    for attr in ("model_file", "module"):
        if hasattr(manifest, attr):
            names.append(getattr(manifest, attr))
    for attr in ("weights", "tokenizer"):
        source = getattr(manifest, attr, None)
        if source is not None and source.source == "package":
            names.append(source.path)
    for name in names:
        if not (package.root / name).exists():
            raise PackageError(f"{package.root}: the manifest names {name!r}, which is not in "
                               "the package; add the file or fix the manifest")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _promote(staging: Path, target: Path) -> None:
    try:
        staging.rename(target)
    except OSError:  # another process won the race: theirs is as good as ours
        shutil.rmtree(staging, ignore_errors=True)
