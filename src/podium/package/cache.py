"""The content-addressed model cache: ready-to-load weights, keyed by sha256.

    $PODIUM_CACHE/
      objects/<sha256>/            a ready-to-load folder (HF layout) + podium-object.json
      refs/<name>@<version>.json   which object a package resolved to, and the source's
                                   fingerprint (so an unchanged source is not re-hashed)

The key is the sha256 of the recipe and the source's content digest, so the same weights
announced twice (or under two names) are materialized once. Objects are built in a staging
folder and renamed into place: a crash never leaves a half-written object behind a valid key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from podium import env
from podium.errors import PackageError
from podium.package import precision, quantize, sources
from podium.package.convert import RECIPE_VERSION, convert_gguf, copy_tokenizer
from podium.package.manifest import VllmManifest
from podium.package.objects import OBJECT_INFO, publish, sha256_file, staging_for
from podium.package.package import Package
from podium.package.progress import Progress

log = logging.getLogger("podium.cache")


@dataclass(frozen=True)
class CacheEntry:
    """A materialized model in the cache."""

    key: str
    path: Path
    reused: bool


class ModelCache:
    """The cache under one root directory (default: $PODIUM_CACHE)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or env.cache_dir()

    def materialize(self, package: Package, progress: Progress | None = None) -> CacheEntry:
        """Put the package's weights into the cache, ready to load; reuse them if present."""
        manifest = _vllm_manifest(package)
        progress = progress or Progress()
        weights = sources.locate(manifest.weights, package.root)
        tokenizer = (sources.locate(manifest.tokenizer, package.root, "tokenizer")
                     if manifest.tokenizer else None)
        key = self._key(package, weights, tokenizer, progress)
        target = self.root / "objects" / key
        if (target / OBJECT_INFO).is_file():
            return self._finish(package, CacheEntry(key, target, reused=True), weights,
                                tokenizer, progress)
        started = time.monotonic()
        with staging_for(target) as staging:
            if weights.is_file() and weights.suffix == ".gguf":
                convert_gguf(weights, staging, progress)
            elif weights.is_dir():
                _copy_tree(weights, staging, progress)
            else:
                raise PackageError(f"weights at {weights} are neither an HF folder nor a .gguf "
                                   "file", param="weights.path")
            if tokenizer is not None:
                copy_tokenizer(tokenizer, staging)
            files = {str(p.relative_to(staging)): sha256_file(p)
                     for p in sources.files_of(staging)}
            publish(staging, target, {"key": key, "package": package.key,
                                      "recipe": RECIPE_VERSION, "files": files,
                                      "created": time.time()})
        log.info("materialized %s into %s in %.1fs", package.key, target,
                 time.monotonic() - started)
        return self._finish(package, CacheEntry(key, target, reused=False), weights, tokenizer,
                            progress)

    def _finish(self, package: Package, entry: CacheEntry, weights: Path,
                tokenizer: Path | None, progress: Progress) -> CacheEntry:
        """Derive the package's quantized checkpoint where its precision needs one, then point
        the package's ref at what it loads."""
        recipe = _recipe(package)
        if recipe is not None:
            key, path, reused = quantize.derive(self.root, entry.key, entry.path, recipe,
                                                progress)
            entry = CacheEntry(key, path, reused=entry.reused and reused)
        self._write_ref(package, entry.key, weights, tokenizer)
        return entry

    def lookup(self, package: Package) -> Path | None:
        """The cached folder for this package if its source is unchanged, without hashing."""
        manifest = _vllm_manifest(package)
        ref = self._ref_path(package)
        if not ref.is_file():
            return None
        data = json.loads(ref.read_text())
        try:
            weights = sources.locate(manifest.weights, package.root)
            tokenizer = (sources.locate(manifest.tokenizer, package.root, "tokenizer")
                         if manifest.tokenizer else None)
        except PackageError:
            return None
        if (data.get("fingerprint") != _fingerprint(weights, tokenizer)
                or data.get("recipe") != _recipe(package)):
            return None
        path = self.root / "objects" / data["key"]
        return path if (path / OBJECT_INFO).is_file() else None

    def _key(self, package: Package, weights: Path, tokenizer: Path | None,
             progress: Progress) -> str:
        h = hashlib.sha256(f"podium-cache/{RECIPE_VERSION}\0".encode())
        h.update(sources.digest(weights, progress).encode())
        if tokenizer is not None:
            h.update(b"\0tokenizer\0" + sources.digest(tokenizer, progress).encode())
        return h.hexdigest()

    def _ref_path(self, package: Package) -> Path:
        return self.root / "refs" / f"{package.key}.json"

    def _write_ref(self, package: Package, key: str, weights: Path,
                   tokenizer: Path | None) -> None:
        ref = self._ref_path(package)
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "fingerprint": _fingerprint(weights, tokenizer),
                                   "recipe": _recipe(package)}))
        tmp.replace(ref)


def _vllm_manifest(package: Package) -> VllmManifest:
    if not isinstance(package.manifest, VllmManifest):
        raise PackageError(f"{package.key}: only vllm packages have weights to materialize "
                           f"(backend is {package.manifest.backend!r})")
    return package.manifest


def _recipe(package: Package) -> str | None:
    """The quantization recipe of the package's precision (None: vLLM loads bf16 as is)."""
    name = _vllm_manifest(package).precision
    return None if name == precision.AUTO else precision.PRECISIONS[name].recipe


def _fingerprint(weights: Path, tokenizer: Path | None) -> list:
    return [sources.fingerprint(weights), sources.fingerprint(tokenizer) if tokenizer else None]


def _copy_tree(source: Path, target: Path, progress: Progress) -> None:
    files = sources.files_of(source)
    with progress.task(f"copying {source.name}", sum(f.stat().st_size for f in files)) as advance:
        for file in files:
            dest = target / file.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(file, dest)  # same filesystem: no bytes copied
            except OSError:
                shutil.copy2(file, dest)
            advance(file.stat().st_size)
