"""A package on disk: a directory (or .tar.gz of one) holding podium.json plus files."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from podium import env
from podium.errors import PackageError
from podium.package.archive import pack, unpack
from podium.package.manifest import (
    MANIFEST_NAME,
    LoraManifest,
    Manifest,
    PipelineManifest,
    PythonManifest,
    VllmManifest,
    WeightsFromPackage,
    load_manifest,
    parse_manifest,
)
from podium.package.objects import promote, sha256_file
from podium.package.paths import DIRECTORY, FILE, kind_of, named_path, package_entries


@dataclass(frozen=True)
class Package:
    """A validated package, unpacked into `root`."""

    root: Path
    manifest: Manifest

    @property
    def key(self) -> str:
        """`name@version`, how the control plane and logs refer to it."""
        return f"{self.manifest.name}@{self.manifest.version}"

    @property
    def backend_name(self) -> str:
        """The backend (`podium.backends`) that serves it: the manifest's, unless a package
        read from another layout (a Triton model) names its own."""
        return self.manifest.backend


def open_package(location: Path | str) -> Package:
    """Open a package directory or safely unpack a .tar.gz package, then validate it: the
    manifest, and every path it names (inside the package, a regular file or directory)."""
    path = Path(location).expanduser()
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise PackageError(f"{path}: no such package (a directory with {MANIFEST_NAME} "
                           "or a .tar.gz of one)") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise PackageError(f"{path!r}: cannot be read ({getattr(exc, 'strerror', exc)})",
                           param="path") from None
    if stat.S_ISDIR(info.st_mode):
        return check_package(path)
    if not path.name.endswith((".tar.gz", ".tgz", ".tar")):
        raise PackageError(f"{path}: a package is a directory or a .tar.gz file")
    if not stat.S_ISREG(info.st_mode):
        raise PackageError(f"{path} is a {kind_of(info.st_mode)}; a package archive is a "
                           "regular .tar.gz file")
    return _open_archive(path)


def _open_archive(path: Path) -> Package:
    """Unpack once into $PODIUM_HOME/unpacked/<digest>: staged, validated, then renamed."""
    try:
        digest = sha256_file(path)[:16]
    except OSError as exc:
        raise PackageError(f"{path}: cannot be read ({exc.strerror})") from None
    target = env.home() / "unpacked" / digest
    if (target / MANIFEST_NAME).is_file():
        return check_package(target)
    staging = _new_staging(target)
    try:
        unpack(path, staging)
        if not (staging / MANIFEST_NAME).is_file():
            raise PackageError(f"{path}: no {MANIFEST_NAME} at the top of the archive; pack "
                               "the package directory with `podium package DIR`")
        manifest = check_package(staging).manifest  # only a valid package is ever promoted
        promote(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Package(target.resolve(), manifest)


def _new_staging(target: Path) -> Path:
    """A fresh `<digest>.partial-<pid>-*` folder beside `target`, after removing the ones
    processes that no longer run left behind (a crash mid-unpack)."""
    unpacked = target.parent
    try:
        unpacked.mkdir(parents=True, exist_ok=True)
        for stale in unpacked.glob("*.partial-*"):
            pid = stale.name.rpartition(".partial-")[2].split("-")[0]
            if pid.isdigit() and not _is_running(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-{os.getpid()}-",
                                        dir=unpacked))
        staging.chmod(0o755)  # as a plain mkdir would make it, not mkdtemp's 0700
    except OSError as exc:
        raise PackageError(f"{unpacked}: cannot unpack packages here ({exc.strerror}); set "
                           "PODIUM_HOME to a writable directory") from None
    return staging


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: running
        return True
    return True


def check_package(root: Path, *, files_must_exist: bool = False) -> Package:
    """Validate the package directory `root`: its manifest, its tree (no FIFOs, devices,
    sockets or links leaving it) and every path the manifest names."""
    root = root.resolve()
    manifest = load_manifest(root / MANIFEST_NAME)
    package_entries(root)
    for field, value, kinds in named_paths(manifest):
        named_path(root, value, field, kinds, must_exist=files_must_exist)
    if isinstance(manifest, LoraManifest):  # an adapter is its two files: check them always
        from podium.package.adapter import check_files

        check_files(root, manifest)
    return Package(root, manifest)


def named_paths(manifest: Manifest) -> list[tuple[str, str, tuple[str, ...]]]:
    """(field, value, allowed kinds) for every package-relative path the manifest names."""
    if isinstance(manifest, PythonManifest):
        return [("module", manifest.module, (FILE,))]
    if isinstance(manifest, PipelineManifest):
        return []  # its steps name their files; the graph checks them at load
    if isinstance(manifest, LoraManifest):
        return [("path", manifest.path, (DIRECTORY,))]
    if isinstance(manifest, VllmManifest):
        sources = (("weights", manifest.weights), ("tokenizer", manifest.tokenizer))
        paths = [(f"{field}.path", source.path, (FILE, DIRECTORY)) for field, source in sources
                 if isinstance(source, WeightsFromPackage)]
        if manifest.constraint_catalog is not None:
            paths.append(("constraint_catalog", manifest.constraint_catalog, (FILE,)))
        return paths
    return [("model_file", manifest.model_file, (FILE,))]


def build_package(source: Path, target: Path) -> Package:
    """`podium package`: validate the directory `source` (every file the manifest names must
    be in it) and write it as a .tar.gz."""
    _require_directory(source)
    package = check_package(source, files_must_exist=True)
    manifest = package.manifest
    if isinstance(manifest, VllmManifest) and manifest.constraint_catalog is not None:
        from podium.package.catalog import read_catalog

        read_catalog(package.root / manifest.constraint_catalog, package.root)  # fails early
    if isinstance(manifest, LoraManifest):
        from podium.package.adapter_base import check_against_local_base

        check_against_local_base(package)  # against its base too, where this machine has it
    pack(package.root, target)
    return package


def default_archive_name(source: Path) -> Path:
    """`NAME-VERSION.tar.gz` for the package directory `source`."""
    _require_directory(source)
    manifest = load_manifest(source / MANIFEST_NAME)
    return Path(f"{manifest.name}-{manifest.version}.tar.gz")


def _require_directory(source: Path) -> None:
    if not source.is_dir():
        raise PackageError(f"{source}: not a directory; `podium package` takes a package "
                           f"directory holding {MANIFEST_NAME}")


def write_manifest(directory: Path, data: dict) -> Package:
    """Write podium.json into `directory` after validating it."""
    manifest = parse_manifest(data, where=str(directory / MANIFEST_NAME))
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2)  # as written by the author, once known to be valid
    (directory / MANIFEST_NAME).write_text(text + "\n")
    return Package(directory.resolve(), manifest)


