"""Every environment variable Podium reads, in one place (documented in docs/operations.md)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


def home() -> Path:
    """PODIUM_HOME: root of Podium's state on this machine (cache, runtime dirs)."""
    return Path(os.environ.get("PODIUM_HOME", Path.home() / ".podium")).expanduser()


def cache_dir() -> Path:
    """PODIUM_CACHE: the content-addressed model cache (default $PODIUM_HOME/cache)."""
    raw = os.environ.get("PODIUM_CACHE")
    return Path(raw).expanduser() if raw else home() / "cache"


def compile_cache_dir() -> Path:
    """PODIUM_COMPILE_CACHE: compiled engine builds (default $PODIUM_CACHE/compiled)."""
    raw = os.environ.get("PODIUM_COMPILE_CACHE")
    return Path(raw).expanduser() if raw else cache_dir() / "compiled"


def constraint_cache_dir() -> Path:
    """PODIUM_CONSTRAINT_CACHE: compiled constraints shared by the processes of a host
    (default: /dev/shm/podium-constraints-<uid>, in memory; else the temp directory)."""
    raw = os.environ.get("PODIUM_CONSTRAINT_CACHE")
    if raw:
        return Path(raw).expanduser()
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"podium-constraints-{os.getuid()}"


def constraint_compiler() -> str:
    """PODIUM_CONSTRAINT_COMPILER: where a server compiles constraints: ``process`` (default:
    a worker process of its own, off the server's GIL) or ``thread`` (the server's threads)."""
    raw = os.environ.get("PODIUM_CONSTRAINT_COMPILER", "process").strip().lower() or "process"
    if raw not in ("process", "thread"):
        raise ValueError(f"PODIUM_CONSTRAINT_COMPILER={raw!r}: use process or thread")
    return raw


def api_key() -> str | None:
    """PODIUM_API_KEY: the bearer key every route but liveness requires; unset means open."""
    return os.environ.get("PODIUM_API_KEY") or None


def admin_key() -> str | None:
    """PODIUM_ADMIN_KEY: a key for the admin routes (repository, /metrics, control API)."""
    return os.environ.get("PODIUM_ADMIN_KEY") or None


def take_internal_key() -> str | None:
    """PODIUM_INTERNAL_KEY: the control plane's credential handed to an instance it started;
    removed from the environment once read, so no child process inherits it."""
    return os.environ.pop("PODIUM_INTERNAL_KEY", None) or None


def database_url() -> str | None:
    """PODIUM_DATABASE_URL: `podium up`'s SQLAlchemy URL when --database is not given."""
    return os.environ.get("PODIUM_DATABASE_URL") or None


DEFAULT_CONTROL_URL = "http://127.0.0.1:8080"


def control_url() -> str:
    """PODIUM_CONTROL_URL: the control-plane API the CLI and a hand-run gateway talk to."""
    return os.environ.get("PODIUM_CONTROL_URL") or DEFAULT_CONTROL_URL


def control_key() -> str | None:
    """PODIUM_CONTROL_KEY: the admin key a hand-run gateway shows the control API."""
    return os.environ.get("PODIUM_CONTROL_KEY") or None


def client_key() -> str | None:
    """The key the control CLI sends: PODIUM_ADMIN_KEY, else PODIUM_API_KEY."""
    return admin_key() or api_key()


def pipeline_gateway_key() -> str | None:
    """PODIUM_PIPELINE_GATEWAY_KEY: the bearer key pipelines send to their `gateway_url`."""
    return os.environ.get("PODIUM_PIPELINE_GATEWAY_KEY") or None


GATEWAY_KEYS = "PODIUM_GATEWAY_KEYS"


def take_gateway_keys() -> dict[str, list[str]]:
    """PODIUM_GATEWAY_KEYS: JSON `{"api_keys": [...], "admin_keys": [...]}`, the literal client
    keys `podium up` hands its gateways; removed once read, so no child inherits them."""
    import json

    return json.loads(os.environ.pop(GATEWAY_KEYS, None) or "{}")


def kv_cache_gib() -> str:
    """VLLM_CPU_KVCACHE_SPACE: KV cache size on CPU in GiB (vLLM's own variable; default 4)."""
    return os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")


def force_offline() -> None:
    """Boot never reaches a model hub: weights come only from the cache."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", kv_cache_gib())


def preload() -> bool:
    """PODIUM_PRELOAD: ``0`` turns the engine preloader off (`podium.preload`); on otherwise."""
    return os.environ.get("PODIUM_PRELOAD", "1") != "0"


def cold_start_wait_s(default: float) -> float:
    """PODIUM_COLD_START_WAIT_S: how long a gateway holds a request for a version at zero
    instances before its 503 with Retry-After (`podium.gateway.hold`)."""
    raw = os.environ.get("PODIUM_COLD_START_WAIT_S")
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


def zygote() -> bool:
    """PODIUM_ZYGOTE: ``0`` starts each vLLM instance of `podium up` as a plain process, under
    the local runtime and Ray alike; on otherwise (the default): they fork from a zygote with
    vLLM imported (`podium.preload.zygote`; on Ray, one per node, `control.runtime.ray_zygote`)."""
    return os.environ.get("PODIUM_ZYGOTE", "1") != "0"


def lora_linear() -> bool:
    """PODIUM_LORA_LINEAR: ``0`` keeps vLLM's CPU LoRA linear on the by-slot ops
    (`engine_patches.lora_slots`); on otherwise (the default): the per-module ops
    (`engine_patches.lora_linear`). Read in the engine's process."""
    return os.environ.get("PODIUM_LORA_LINEAR", "1") != "0"


def preload_worker_fork(environ: Mapping[str, str] | None = None) -> bool:
    """PODIUM_PRELOAD_WORKER_FORK: ``0`` spawns the engine core's worker; on otherwise
    (`podium.preload.worker`). Read from `environ`: the server's environment at the engine's
    start, which the engine core forked from the preloader takes."""
    return (os.environ if environ is None else environ).get(
        "PODIUM_PRELOAD_WORKER_FORK", "1") != "0"


def worker_threads(environ: Mapping[str, str] | None = None) -> str | None:
    """PODIUM_WORKER_THREADS: the OpenMP threads of every CPU engine worker on this host
    (``auto`` or a count), over a package's `worker_threads`; unset: the package decides
    (`podium.backends.vllm.worker_threads`)."""
    return (os.environ if environ is None else environ).get("PODIUM_WORKER_THREADS") or None


def admission_refresh(environ: Mapping[str, str] | None = None) -> bool:
    """PODIUM_ADMISSION_REFRESH: ``0`` keeps a cached admission measurement as it is: no
    re-measurement after ready, however old (`podium.backends.vllm.sizing`)."""
    return (os.environ if environ is None else environ).get("PODIUM_ADMISSION_REFRESH",
                                                            "1") != "0"


def kv_lazy_zero(environ: Mapping[str, str] | None = None) -> bool:
    """PODIUM_KV_LAZY_ZERO: ``0`` lets vLLM write its whole CPU KV cache with zeros at boot
    instead of mapping it zeroed by the kernel as first used (`engine_patches.kv_lazy_zero`)."""
    return (os.environ if environ is None else environ).get("PODIUM_KV_LAZY_ZERO", "1") != "0"


def engine_spin(environ: Mapping[str, str] | None = None) -> bool:
    """PODIUM_ENGINE_SPIN: ``0`` makes an engine core whose worker's team has every core (and
    its worker) wait on vLLM's socket instead of spinning (`podium.preload.waits`); vLLM's
    spin otherwise (the default: the socket wait booted 10-19 s slower, measured)."""
    return (os.environ if environ is None else environ).get("PODIUM_ENGINE_SPIN", "1") != "0"
