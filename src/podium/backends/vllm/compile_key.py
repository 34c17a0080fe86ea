"""The key of a package's compiled engine artifacts: engine version, engine args, hardware.

Compiled code is only valid for the engine (and torch) that produced it, the engine args that
shaped the graph and the hardware it was generated for, so each is a factor of the key and
any change in one is a different key: artifacts are never reused across them. The weights
enter by their content-addressed cache key, so two packages with the same weights and args
share one build.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

FORMAT = 1
"""Bump when the layout of a compiled entry changes: every older entry then misses."""

_CPU_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16",
                  "amx_tile", "asimd", "sve")
"""The CPU flags Inductor's C++ code generation picks its vector ISA by."""

FACTOR_NAMES = {"engine": "engine version", "torch": "torch version", "python": "Python",
                "weights": "weights", "engine_args": "engine args", "hardware": "hardware",
                "engine_env": "engine environment", "format": "cache format"}
"""How a log line names each factor when it tells why a build cannot be reused."""


def key_factors(*, engine: str, torch: str, weights: str, engine_args: dict[str, Any],
                hardware: dict[str, Any], engine_env: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """Everything compiled artifacts depend on, as plain JSON."""
    return {"format": FORMAT, "engine": engine, "torch": torch,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "weights": weights, "engine_args": _plain(engine_args), "hardware": hardware,
            "engine_env": _plain(engine_env or {})}


def compile_key(factors: dict[str, Any]) -> str:
    """sha256 of the factors in canonical JSON."""
    text = json.dumps(factors, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def compiled_engine_args(engine_args: dict[str, Any], *, task: str, mode: str) -> dict:
    """The package's engine args as they shape the compiled graph (names normalized)."""
    args = {k.replace("-", "_"): v for k, v in engine_args.items()}
    args.pop("enforce_eager", None)  # the mode says it
    return {**args, "task": task, "engine_mode": mode}


def differences(wanted: dict[str, Any], cached: dict[str, Any]) -> list[str]:
    """Human-readable factor differences, e.g. "engine args: max_model_len 512 → 1024"."""
    out = []
    for name in sorted(set(wanted) | set(cached)):
        new, old = wanted.get(name), cached.get(name)
        if new == old:
            continue
        label = FACTOR_NAMES.get(name, name)
        if isinstance(new, dict) and isinstance(old, dict):
            changed = [f"{k} {_short(old.get(k))} → {_short(new.get(k))}"
                       for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)]
            out.append(f"{label}: {', '.join(changed)}")
        else:
            out.append(f"{label}: {_short(old)} → {_short(new)}")
    return out


def hardware(kind: str) -> dict[str, Any]:
    """What compiled code is specific to on this machine: CPU model and ISA, or the GPUs."""
    if kind == "cuda":
        return _cuda_hardware()
    return _cpu_hardware(kind)


def engine_version() -> str:
    """The installed engine as dist==version (the pin is checked at boot)."""
    from podium.engine import installed_engine

    found = installed_engine()
    return f"{found[0]}=={found[1]}" if found else "none"


_SET_BY_ENGINE = ("VLLM_WORKER_MULTIPROC_METHOD", "VLLM_DISABLE_SHARED_EXPERTS_STREAM",
                  "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_USE_TRITON_AWQ",
                  "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE")
"""Variables vLLM sets in its own process from its config (platforms/cpu.py, config/vllm.py):
already keyed by the args and hardware, and set or not depending on whether an engine was
configured earlier in this process, so they must not enter the key."""


def engine_env() -> dict[str, Any]:
    """The environment variables vLLM itself keys its compile cache on (its VLLM_* settings
    that can change a graph), so Podium's key never matches where vLLM's would not."""
    from vllm import envs

    factors = envs.compile_factors()
    return _plain({k: v for k, v in factors.items() if k not in _SET_BY_ENGINE})


def torch_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


@functools.cache
def _cpu_hardware(kind: str) -> dict[str, Any]:
    model, flags = "unknown", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "CPU part") and model == "unknown":
            model = value.strip()
        elif name in ("flags", "Features") and not flags:
            flags = set(value.split())
    return {"kind": kind, "arch": platform.machine(), "cpu": model,
            "isa": sorted(f for f in _CPU_ISA_FLAGS if f in flags)}


@functools.cache
def _cuda_hardware() -> dict[str, Any]:
    import torch

    count = torch.cuda.device_count()
    devices = []
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        devices.append(f"{torch.cuda.get_device_name(i)} sm_{major}{minor}")
    return {"kind": "cuda", "arch": platform.machine(), "gpus": devices,
            "cuda": torch.version.cuda}


def _plain(value: Any) -> Any:
    """JSON round trip: tuples become lists, so a key computed twice is the same key."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _short(value: Any) -> str:
    text = "unset" if value is None else json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."
