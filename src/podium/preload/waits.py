"""The engine core's wait for its worker when the worker's OpenMP team has every core.

vLLM's shared-memory queues (`shm_broadcast.MessageQueue`) make a reader spin for a second
after each read (`SpinCondition.busy_loop_s`, `sched_yield` between checks) before it sleeps
on a socket the writer pings at every write. With vLLM's own CPU binding that spin runs on the
core it reserves for the engine core. With a team on every core (`backends.vllm.worker_threads`
auto on 2 cores) it runs on a core a team thread computes on, and a yielding spinner still
takes its fair share there: the whole team then waits at each barrier for the thread it
slowed. So with ``PODIUM_ENGINE_SPIN=0``, when the binding covers every CPU the engine core may
run on, its readers (and its worker's, which is forked from it and inherits this) sleep on the
socket at once instead (`busy_loop_s=0`). Off by default: measured (docs/benchmarks.md,
"Worker threads chosen at boot"), it cut the engine core's CPU per token from 0.7-2.1 ms to
0.1-0.2 ms, but its boots' `start engine` took 18-27 s against 10-11 s with the spin, and its
tokens/s were no steadier.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger("vllm.podium.preload")
"""Under vLLM's logger: this runs in the engine core."""
QUEUE_MODULE = "vllm.distributed.device_communicators.shm_broadcast"


def bound_cpus(bind: str) -> set[int] | None:
    """The CPUs of a ``VLLM_CPU_OMP_THREADS_BIND`` value ("0,1", "0-3", ranks split by "|"),
    or None for `auto`, `nobind` or anything else; also reads Linux's CPU lists (sysfs)."""
    found: set[int] = set()
    for part in bind.replace("|", ",").split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        found.update(range(int(low), int(high or low) + 1))
    return found or None


def quiet(env: Mapping[str, str], cpus: Iterable[int]) -> bool:
    """Whether the engine core's readers should sleep at once: the worker's binding covers
    every CPU in `cpus` (the engine core's) and the operator did not ask for vLLM's spin."""
    from podium import env as podium_env

    if podium_env.engine_spin(env):
        return False
    bound = bound_cpus(env.get("VLLM_CPU_OMP_THREADS_BIND", ""))
    return bound is not None and set(cpus) <= bound


def install(env: Mapping[str, str]) -> None:
    """In an engine core forked from the preloader, before vLLM runs."""
    queues = sys.modules.get(QUEUE_MODULE)  # the preloader's import
    if queues is None or not quiet(env, os.sched_getaffinity(0)):
        return
    spin = queues.SpinCondition
    if "busy_loop_s" not in inspect.signature(spin.__init__).parameters:
        return  # another engine version: leave its waits alone
    spin.__init__ = _sleeping(spin.__init__)


def _sleeping(init: Any) -> Any:
    logged = []

    @functools.wraps(init)
    def sleeping(self: Any, is_reader: bool, *args: Any, **kwargs: Any) -> None:
        if is_reader:
            kwargs["busy_loop_s"] = 0
            if not logged:  # logged here: vLLM has set its logging up by its first queue
                logged.append(True)
                log.info("this engine process waits for its queue on a socket, not spinning: "
                         "the worker's OpenMP team has every core (PODIUM_ENGINE_SPIN=0)")
        init(self, is_reader, *args, **kwargs)

    return sleeping
