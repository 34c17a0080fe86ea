"""The admission probe's last measurement, kept in Podium's cache so a boot need not re-run it.

`probe.measure` runs requests through a fresh engine (1-3 s of a 2-core machine's boot) to size
its admission bounds. What it measures depends on the weights, the engine configuration, the
machine and the worker's threads, none of which change from one boot of the same package on
the same machine to the next. So a boot reads the rates measured last time under the same
factors (`key_factors`) and starts serving on them; the backend then measures again after
ready, in the background, when the engine is idle (`VllmBackend._remeasure`), and writes the
new figures back. The bounds shown at boot say which they are: "measured at <time> on this
machine" or "measured now".

A record is one JSON file under ``$PODIUM_CACHE/probe/<sha256 of the factors>.json``, written
atomically. One missing, unreadable, for other factors, or older than `MAX_AGE_S` is a miss:
the probe runs at boot as before. Nothing here can fail a boot: every error is a miss (logged)
or a write skipped (logged).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from podium.backends.vllm.admission import Rates

log = logging.getLogger("podium.backends.vllm")
VERSION = 1
"""Bumped when what the probe measures changes (`probe`'s shapes): old records then miss."""
MAX_AGE_S = 7 * 24 * 3600.0
"""Older than this, a record is not trusted at boot (re-measured there instead)."""
SPEED_ENV = ("LD_PRELOAD", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND",
             "VLLM_CPU_KVCACHE_SPACE", "PODIUM_ENGINE_TCMALLOC", "PODIUM_ENGINE_SPIN")
"""Environment variables that change the engine's speed on the same machine."""


@dataclass(frozen=True)
class Cached:
    """Rates read back, and when they were measured (seconds since the epoch)."""

    rates: Rates
    measured_at: float


def key_factors(weights: str, engine: Any, threads: Any, machine: dict[str, Any]
                ) -> dict[str, Any]:
    """What the probe's figures depend on: the weights (their content-addressed folder), the
    engine's configuration as it runs (dtype, lengths, batch, mode), the worker's threads and
    the machine (`machine_factors`)."""
    config = engine.vllm_config
    model, sched = config.model_config, config.scheduler_config
    return {"version": VERSION, "weights": weights,
            "engine": {"dtype": str(model.dtype), "max_model_len": int(model.max_model_len),
                       "max_num_seqs": int(sched.max_num_seqs),
                       "max_num_batched_tokens": int(sched.max_num_batched_tokens),
                       "chunked_prefill": bool(sched.enable_chunked_prefill),
                       "quantization": str(getattr(model, "quantization", None)),
                       "compilation_mode": str(getattr(config.compilation_config, "mode", None)),
                       "kv_cache_dtype": str(getattr(getattr(config, "cache_config", None),
                                                     "cache_dtype", None)),
                       "max_loras": getattr(getattr(config, "lora_config", None), "max_loras",
                                            None)},
            "threads": None if threads is None else [threads.threads, threads.bind],
            "machine": machine}


def machine_factors() -> dict[str, Any]:
    """This machine as the probe sees it: CPU model and ISA, CPUs this process may use,
    memory, engine and torch versions, and the speed-relevant environment."""
    from podium.backends.vllm import compile_key as keys
    from podium.package import engine_mode

    kind = engine_mode.machine_kind()
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        pages = 0
    return {"hardware": keys.hardware(kind), "cpus": len(os.sched_getaffinity(0)),
            "memory_gib": round(pages / 2**30), "engine": keys.engine_version(),
            "torch": keys.torch_version(),
            "env": {k: os.environ.get(k) for k in SPEED_ENV}}


def path_for(root: Path, factors: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(factors, sort_keys=True, default=str).encode())
    return root / "probe" / f"{digest.hexdigest()}.json"


def lookup(root: Path, factors: dict[str, Any], now: float | None = None) -> Cached | None:
    """The last rates measured under these factors, or None (a miss, logged when the file is
    there but unusable)."""
    path = path_for(root, factors)
    if not path.is_file():
        return None
    now = time.time() if now is None else now
    try:
        data = json.loads(path.read_text())
        if data["factors"] != json.loads(json.dumps(factors, sort_keys=True, default=str)):
            log.info("admission probe cache %s: recorded for other factors; measuring", path)
            return None
        cached = Cached(Rates(**data["rates"]), float(data["measured_at"]))
        if not _plausible(cached.rates):
            raise ValueError(f"implausible rates {data['rates']}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("admission probe cache %s is unreadable (%s); measuring at boot", path, exc)
        return None
    if now - cached.measured_at > MAX_AGE_S or cached.measured_at > now + 60:
        log.info("admission probe cache %s: measured %.0f h ago; measuring at boot", path,
                 (now - cached.measured_at) / 3600)
        return None
    return cached


def store(root: Path, factors: dict[str, Any], rates: Rates, now: float | None = None) -> None:
    """Write these rates as the last measurement under these factors (atomically)."""
    path = path_for(root, factors)
    record = {"factors": factors, "rates": asdict(rates),
              "measured_at": time.time() if now is None else now}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(record, sort_keys=True, default=str))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("admission probe cache %s not written: %s", path, exc)


def _plausible(rates: Rates) -> bool:
    ok = rates.prefill_tokens_per_s > 0 and rates.batch >= 1 and rates.prefill_tokens >= 1
    return ok and (rates.decode_tokens_per_s is None or rates.decode_tokens_per_s > 0)
