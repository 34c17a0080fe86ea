"""Adapters in the model cache, indexed by the base they run on.

    $PODIUM_CACHE/
      objects/<sha256>/                        PEFT's two files + podium-object.json
      adapters/<base>@<bv>/<name>@<version>.json   {key, name, version, rank, base}

`materialize` puts an announced adapter there (content-addressed like model weights: the same
adapter under two names is stored once); an instance serving the base finds every adapter of
its base with `find` / `list_for` on each request, so an adapter announced after the instance
booted is served without a restart or a registration call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from podium import env
from podium.errors import PackageError
from podium.package.adapter import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterInfo,
    adapter_of,
    check_files,
)
from podium.package.objects import OBJECT_INFO, publish, sha256_file, staging_for
from podium.package.package import Package

_INDEX = "adapters"


@dataclass(frozen=True)
class StoredAdapter:
    """One adapter version ready to load: where its PEFT files are."""

    info: AdapterInfo
    path: Path


class AdapterStore:
    """The adapters under one cache root (default: $PODIUM_CACHE)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or env.cache_dir()

    def materialize(self, package: Package) -> StoredAdapter:
        """Copy the adapter's files into the cache and index it under its base."""
        info = adapter_of(package.manifest)
        if info is None:
            raise PackageError(f"{package.key} is not an adapter (backend is "
                               f"{package.manifest.backend!r})", param="backend")
        files = check_files(package.root, package.manifest)
        sources = [files.folder / ADAPTER_CONFIG, files.folder / ADAPTER_WEIGHTS]
        digest = hashlib.sha256(b"podium-adapter/1\0")
        for source in sources:
            digest.update(sha256_file(source).encode() + b"\0")
        key = digest.hexdigest()
        target = self.root / "objects" / key
        if not (target / OBJECT_INFO).is_file():
            with staging_for(target) as staging:
                for source in sources:
                    shutil.copyfile(source, staging / source.name)
                publish(staging, target, {"key": key, "package": package.key,
                                          "adapter": True, "created": time.time()})
        self._write_index(info, key)
        return StoredAdapter(info, target)

    def find(self, base_key: str, name: str, version: str | None = None
             ) -> StoredAdapter | None:
        """`name@version` of base `base_key`, or its highest version when none is given."""
        if version is not None:
            return self._read(self._index_dir(base_key) / f"{name}@{version}.json")
        versions = [a for a in self.list_for(base_key) if a.info.name == name]
        return max(versions, key=lambda a: _version_key(a.info.version), default=None)

    def list_for(self, base_key: str) -> list[StoredAdapter]:
        """Every adapter of `base_key` in the cache, by name then version."""
        folder = self._index_dir(base_key)
        try:
            entries = sorted(folder.glob("*@*.json"))
        except OSError:
            return []
        found = [a for a in (self._read(path) for path in entries) if a is not None]
        return sorted(found, key=lambda a: (a.info.name, _version_key(a.info.version)))

    def remove(self, base_key: str, name: str, version: str) -> bool:
        """Stop serving adapter name@version of `base_key` (its index entry goes; the files
        stay for the cache's GC). False when it was not there."""
        index = self._index_dir(base_key) / f"{name}@{version}.json"
        try:
            index.unlink()
        except FileNotFoundError:
            return False
        return True

    def carry(self, stored: StoredAdapter, base_key: str) -> StoredAdapter:
        """Index a stored adapter under another version of its base as well (a base rollout
        carries its adapters over): instances of that version find it as their own."""
        base_name, _, base_version = base_key.partition("@")
        info = replace(stored.info, base_name=base_name, base_version=base_version)
        self._write_index(info, stored.path.name)
        return StoredAdapter(info, stored.path)

    def _index_dir(self, base_key: str) -> Path:
        if "/" in base_key or base_key.startswith("."):
            raise PackageError(f"base={base_key!r} is not name@version", param="base")
        return self.root / _INDEX / base_key

    def _read(self, path: Path) -> StoredAdapter | None:
        if "/" in path.name or not path.name.endswith(".json"):
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        folder = self.root / "objects" / str(data.get("key", ""))
        if not (folder / OBJECT_INFO).is_file():
            return None
        base_name, _, base_version = str(data.get("base", "")).partition("@")
        info = AdapterInfo(str(data["name"]), str(data["version"]), base_name, base_version,
                           int(data["rank"]))
        return StoredAdapter(info, folder)

    def _write_index(self, info: AdapterInfo, key: str) -> None:
        index = self._index_dir(info.base_key) / f"{info.key}.json"
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "name": info.name, "version": info.version,
                                   "rank": info.rank, "base": info.base_key}))
        tmp.replace(index)


def _version_key(version: str) -> tuple[int, int | str]:
    """Numeric versions by value, above any non-numeric one (as the repository orders them)."""
    return (1, int(version)) if version.isdigit() else (0, version)
