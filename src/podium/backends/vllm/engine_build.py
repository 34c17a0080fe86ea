"""A vLLM package's compiled build: its mode resolved at boot, built at announce, listed.

Boot: `prepare` resolves the engine mode onto vLLM's args and, when it runs compiled, names the
compile-cache job that `start` runs the engine under (hit: the engine loads the artifacts;
miss: one log line says why, the engine compiles and the result is cached). Announce
(`podium materialize`, `podium announce`): `build` compiles in a child process that starts the
engine exactly as boot does, so boot then finds the artifacts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from podium.backends.vllm import compile_key as keys
from podium.backends.vllm import worker_threads as threads
from podium.backends.vllm.compile_cache import CompileCache, CompileJob, run_with_artifacts
from podium.errors import PackageError
from podium.package import engine_mode
from podium.package.manifest import VllmManifest
from podium.package.package import Package

if TYPE_CHECKING:
    from podium.backends.vllm.worker_threads import WorkerThreads

log = logging.getLogger("podium.compile_cache")
T = TypeVar("T")
JOB_LOG = "compile.log"


def resolve_mode(package: Package) -> engine_mode.ResolvedMode:
    """The engine mode this package runs in on this machine."""
    manifest = _manifest(package)
    return engine_mode.resolve(manifest.engine_mode, manifest.engine_args,
                               engine_mode.machine_kind(), where=package.key)


def prepare(package: Package, weights: Path, args: Namespace) -> CompileJob | None:
    """Set the resolved engine mode on vLLM's args (logged in one line); the compile job
    when the package runs compiled."""
    resolved = resolve_mode(package)
    engine_mode.apply(resolved, args)
    log.info("%s", resolved.describe(package.key))
    return job_for(package, weights, resolved) if resolved.compiled else None


def worker_threads(package: Package) -> WorkerThreads | None:
    """The engine worker's OpenMP threads on this machine (CPU only; None elsewhere), chosen
    by `podium.backends.vllm.worker_threads` and logged in one line."""
    if engine_mode.machine_kind() != "cpu":
        return None
    return threads.resolve(_manifest(package).worker_threads, package.key)


def job_for(package: Package, weights: Path, resolved: engine_mode.ResolvedMode) -> CompileJob:
    """The compile-cache job of this package with these cached weights on this machine."""
    from podium import env

    env.force_offline()  # the engine environment an instance boots with, so the keys agree
    _reloadable_on(resolved.machine_kind)
    manifest = _manifest(package)
    factors = keys.key_factors(
        engine=keys.engine_version(), torch=keys.torch_version(), weights=weights.name,
        # the precision sets the dtype the graph is traced in (auto resolves by the hardware,
        # which is a factor of its own)
        engine_args=keys.compiled_engine_args({**manifest.engine_args,
                                               "precision": manifest.precision},
                                              task=manifest.task, mode=resolved.mode),
        hardware=keys.hardware(resolved.machine_kind), engine_env=keys.engine_env())
    return CompileJob(package.key, factors)


AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"


def _reloadable_on(kind: str) -> None:
    """On CPU, compile the way the engine can load back. vLLM 0.32 saves its AOT build there
    but cannot load it alone (the stock-Inductor function of DYNAMO_TRACE_ONCE has no
    `finalize_loading`; upstream turned AOT off on CPU, vllm-project/vllm#32037):
    `podium.engine_patches.aot_load` fixes the load, and a boot from the cache then skips
    Dynamo (10 s instead of 66 s here). Where that plugin is not installed for this engine,
    AOT is turned off: Dynamo traces at each boot and Inductor's FX-graph and AOTAutograd
    caches in the entry serve the compiled code. Set before the key is computed, so it is a
    factor of it; an operator's own setting stays."""
    from podium.engine_patches import aot_load

    if (kind == "cpu" and AOT_COMPILE_ENV not in os.environ
            and not aot_load.fixes_installed_engine()):
        os.environ[AOT_COMPILE_ENV] = "0"


def start(job: CompileJob | None, start_engine: Callable[[], T]) -> T:
    """Start the engine, under the compile cache when it runs compiled."""
    if job is None:
        return start_engine()
    return run_with_artifacts(job, start_engine)[0]


def build(package: Package, weights: Path) -> str:
    """Announce-time compile: build the package's artifacts unless eager or cached; returns
    one line saying what happened."""
    resolved = resolve_mode(package)
    if not resolved.compiled:
        return f"{resolved.describe(package.key)}: nothing to compile"
    job = job_for(package, weights, resolved)
    cache = CompileCache()
    entry = cache.lookup(job.key)
    if entry is not None:
        return f"compiled artifacts reused: {entry.path} ({entry.num_bytes / 1e6:.1f} MB)"

    def compile_in_child() -> None:
        engine_root = Path(os.environ["VLLM_CACHE_ROOT"])
        log_path = engine_root.parent / JOB_LOG
        log.info("compiling %s (engine log: %s)", package.key, log_path)
        with log_path.open("w") as out:
            done = subprocess.run([sys.executable, "-m", "podium.backends.vllm.compile_job",
                                   str(package.root)], stdout=out, stderr=subprocess.STDOUT,
                                  check=False, preexec_fn=_die_with_parent)
        if done.returncode != 0:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise PackageError(f"compiling {package.key} failed (exit {done.returncode}); "
                               f"engine log {log_path}:\n{tail}")

    _, hit = run_with_artifacts(job, compile_in_child, cache)
    entry = cache.lookup(job.key)
    assert entry is not None
    return (f"compiled artifacts {'reused' if hit else 'built'} in "
            f"{entry.info.get('compile_seconds', 0):.0f} s: {entry.path} "
            f"({entry.num_bytes / 1e6:.1f} MB)")


def cached(package: Package) -> dict[str, Any]:
    """What the cache holds for this package: its weights and every compiled build, each
    marked `current` when this machine would boot from it."""
    from podium.package.cache import ModelCache

    weights = ModelCache().lookup(package)
    current_key = None
    mode = None
    if weights is not None:
        resolved = resolve_mode(package)
        mode = resolved.mode
        if resolved.compiled:
            current_key = job_for(package, weights, resolved).key
    builds = [{"key": e.key, "current": e.key == current_key, "path": str(e.path),
               "bytes": e.num_bytes, "files": len(e.info.get("files", {})),
               "compile_seconds": e.info.get("compile_seconds"), "hits": e.info.get("hits", 0),
               "engine": e.info["factors"].get("engine"),
               "hardware": e.info["factors"].get("hardware"),
               "engine_args": e.info["factors"].get("engine_args")}
              for e in CompileCache().entries()
              if e.info.get("package") == package.key
              or (weights is not None and e.info["factors"].get("weights") == weights.name)]
    return {"weights": str(weights) if weights else None, "engine_mode": mode,
            "compiled_key": current_key,
            "compiled_cached": any(b["current"] for b in builds), "compiled": builds}


def _die_with_parent() -> None:
    """In the compile child: SIGTERM when the announcing process dies (Linux), so a killed
    announce leaves no engine compiling into an entry nobody will publish."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _manifest(package: Package) -> VllmManifest:
    if not isinstance(package.manifest, VllmManifest):
        raise PackageError(f"{package.key}: only vllm packages have an engine mode")
    return package.manifest
