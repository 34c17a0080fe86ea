"""Compiled engine artifacts in the model cache, beside the weights, keyed by compile_key.

    $PODIUM_CACHE/compiled/       (or $PODIUM_COMPILE_CACHE)
      <key>/engine/               the engine's own cache root (VLLM_CACHE_ROOT): vLLM's
                                  torch.compile cache (torch_compile_cache/, AOT artifacts),
                                  Inductor's caches and generated code (torchinductor/),
                                  model-inspection cache, …
      <key>/podium-compiled.json  the factors of the key, files, sizes, compile seconds, hits
      <key>.lock                  held while one process compiles or boots from the entry

An entry is written in place by the engine that compiles it and counts only once its
podium-compiled.json exists (written after the engine came up), so a crash mid-compile
leaves an entry that the next run wipes and compiles again. The engine reads and writes the
entry at its final path: vLLM's artifacts hold absolute paths into its cache root.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from podium import env
from podium.backends.vllm import compile_key as keys

log = logging.getLogger("podium.compile_cache")
INFO = "podium-compiled.json"
T = TypeVar("T")
_ENV_LOCK = threading.Lock()  # one engine start at a time may point the environment at an entry


@dataclass(frozen=True)
class CompiledEntry:
    """One compiled build in the cache."""

    key: str
    path: Path
    info: dict[str, Any]

    @property
    def engine_root(self) -> Path:
        return self.path / "engine"

    @property
    def num_bytes(self) -> int:
        return int(self.info.get("bytes", 0))


class CompileCache:
    """The compiled builds under one directory (default: $PODIUM_CACHE/compiled)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or env.compile_cache_dir()

    def lookup(self, key: str) -> CompiledEntry | None:
        """The finished entry for this key, or None."""
        info_path = self.root / key / INFO
        try:
            info = json.loads(info_path.read_text())
        except (OSError, ValueError):
            return None
        return CompiledEntry(key, self.root / key, info)

    def entries(self) -> list[CompiledEntry]:
        """Every finished entry, newest first."""
        found = [e for p in self.root.glob("*/") if (e := self.lookup(p.name)) is not None]
        return sorted(found, key=lambda e: -float(e.info.get("created", 0)))

    def why_missing(self, factors: dict[str, Any], package_key: str) -> str:
        """Why no entry matches: the closest entry of this package (or these weights) and how
        its factors differ, or that none was ever built."""
        related = [e for e in self.entries() if e.info.get("package") == package_key
                   or e.info.get("factors", {}).get("weights") == factors["weights"]]
        if not related:
            return "nothing compiled for it yet (announce it with `podium materialize` to " \
                   "compile off the boot path)"
        diffs = min((keys.differences(factors, e.info.get("factors", {})) for e in related),
                    key=len)
        return "the cached build differs in " + "; ".join(diffs)

    @contextlib.contextmanager
    def building(self, key: str) -> Iterator[tuple[Path, CompiledEntry | None]]:
        """Hold the entry's lock; yield (engine root, finished entry or None). An unfinished
        entry left by a crash is wiped first, so the engine compiles from a clean root."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / f"{key}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a second instance waits, then finds it built
            try:
                entry = self.lookup(key)
                if entry is None:
                    shutil.rmtree(self.root / key, ignore_errors=True)
                (self.root / key / "engine").mkdir(parents=True, exist_ok=True)
                yield self.root / key / "engine", entry
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def publish(self, key: str, factors: dict[str, Any], package_key: str,
                seconds: float) -> CompiledEntry:
        """Mark the entry finished: its factors, files and sizes (call with the lock held)."""
        path = self.root / key
        files = {str(f.relative_to(path / "engine")): f.stat().st_size
                 for f in sorted((path / "engine").rglob("*")) if f.is_file()}
        info = {"key": key, "package": package_key, "factors": factors, "files": files,
                "bytes": sum(files.values()), "compile_seconds": round(seconds, 1),
                "created": time.time(), "hits": 0}
        _write_json(path / INFO, info)
        return CompiledEntry(key, path, info)

    def count_hit(self, entry: CompiledEntry) -> CompiledEntry:
        """One more boot served from this entry (call with the lock held)."""
        info = {**entry.info, "hits": int(entry.info.get("hits", 0)) + 1,
                "last_hit": time.time()}
        _write_json(entry.path / INFO, info)
        return CompiledEntry(entry.key, entry.path, info)


@dataclass(frozen=True)
class CompileJob:
    """What one engine start needs to use (or fill) the compile cache."""

    package_key: str
    factors: dict[str, Any]

    @property
    def key(self) -> str:
        return keys.compile_key(self.factors)


def run_with_artifacts(job: CompileJob, start: Callable[[], T],
                       cache: CompileCache | None = None) -> tuple[T, bool]:
    """Run `start` (an engine start) with the engine's cache root on the job's entry; publish
    the entry if the engine compiled it. Returns (start's result, whether it was a hit)."""
    cache = cache or CompileCache()
    key = job.key
    with cache.building(key) as (engine_root, entry):
        if entry is not None:
            log.info("compile cache hit for %s: restoring %d files (%.1f MB, compiled in "
                     "%.0f s) from %s; the engine loads them instead of compiling",
                     job.package_key, len(entry.info.get("files", {})), entry.num_bytes / 1e6,
                     entry.info.get("compile_seconds", 0), entry.path)
        else:
            log.info("compile cache miss for %s (key %s): %s; the engine compiles now and the "
                     "result is cached", job.package_key, key[:12],
                     cache.why_missing(job.factors, job.package_key))
        before = _artifacts(engine_root)
        started = time.monotonic()
        with engine_environment(engine_root):
            result = start()
        seconds = time.monotonic() - started
        if entry is None:
            entry = cache.publish(key, job.factors, job.package_key, seconds)
            log.info("compiled %s in %.0f s: %d files, %.1f MB cached under %s",
                     job.package_key, seconds, len(entry.info["files"]), entry.num_bytes / 1e6,
                     entry.path)
            return result, False
        after = _artifacts(engine_root)
        new = sorted({_build_name(p) for p, mtime in after.items() if before.get(p) != mtime})
        if new:  # vLLM's own key (env, source files) differed, or its artifact did not load
            log.warning("the engine compiled %s although Podium's compile cache matched: vLLM "
                        "did not load the cached build (rewrote %s); the entry is refreshed",
                        job.package_key, ", ".join(new))
            cache.publish(key, job.factors, job.package_key, seconds)
            return result, False
        cache.count_hit(entry)
        return result, True


@contextlib.contextmanager
def engine_environment(engine_root: Path) -> Iterator[None]:
    """Point vLLM's cache root (and Inductor's and Triton's, which it otherwise leaves at
    their defaults until it compiles) at `engine_root` while an engine starts."""
    names = {"VLLM_CACHE_ROOT": engine_root,
             "TORCHINDUCTOR_CACHE_DIR": engine_root / "torchinductor",
             "TRITON_CACHE_DIR": engine_root / "triton"}
    with _ENV_LOCK:
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update({name: str(path) for name, path in names.items()})
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _artifacts(engine_root: Path) -> dict[Path, int]:
    """What a compile writes, with mtimes: vLLM's own builds
    (`torch_compile_cache/<vLLM's key>/rank_*/<artifact>`, and on CPU the C++ kernels its AOT
    build loads, `…/inductor_cache/**`, built again at load where their source changed: an
    entry moved to another path, measured ~15 s of g++ on the boot path) and Inductor's
    FX-graph and AOTAutograd cache entries (the compiled code on CPU, where vLLM's AOT build is
    off). A compile writes a new one or rewrites one; a load leaves them as they were."""
    found = {}
    for pattern in ("torch_compile_cache/**/rank_*/*", "torch_compile_cache/**/inductor_cache/**/*",
                    "torchinductor/fxgraph/**/*", "torchinductor/aotautograd/**/*"):
        for path in engine_root.glob(pattern):
            if path.is_file():
                found[path.relative_to(engine_root)] = path.stat().st_mtime_ns
    return found


def _build_name(artifact: Path) -> str:
    """The build an artifact belongs to, as the warning names it."""
    parts = artifact.parts
    if parts[0] == "torchinductor":
        return "/".join(parts[:2])  # torchinductor/fxgraph, torchinductor/aotautograd
    return str(Path(*parts[1:]).parent.parent)  # vLLM's: <kind>/<its key>


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
