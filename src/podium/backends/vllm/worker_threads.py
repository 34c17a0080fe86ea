"""How many OpenMP threads the engine's worker computes with on CPU, and on which cores:
chosen at boot on the machine it runs on, overridable, logged in one line.

vLLM's own CPU binding (`VLLM_CPU_OMP_THREADS_BIND=auto`) reserves one core for the engine
core's scheduler and binds the worker's team to the rest, one thread per core. On an instance
with 2 cores that is one compute thread. Measured here (2 cores, docs/benchmarks.md "Two
OpenMP threads for the worker" and "Worker threads chosen at boot"): in a quiet window, two
threads, one per core, none reserved, served 1.30x (128/64) and 1.15x (32/256) the output
tokens/s of one, the engine core and the server sharing those cores (its wait for the worker
yields: `sched_yield` in vLLM's shared-memory queue); on a machine whose cores other processes
also wanted, two threads scattered (88-374 tok/s) around one thread's steady figures, and a
test module with several engines on 2 cores took 2.2x as long (the suite keeps one thread).
So `auto` binds all of the instance's cores when it has 2, for an instance with its cores to
itself (one logical CPU per physical core, as vLLM's auto takes them); with 1 core, or more
than measured (`ALL_CORES_UP_TO`), it leaves vLLM's binding, which reserves a core where that
costs a smaller share of the compute.

Precedence (the first that is set decides):

1. ``VLLM_CPU_OMP_THREADS_BIND`` in the environment: the operator's binding, or the local
   runtime's when several instances share the machine (`control.runtime.local`); vLLM binds by
   it, as before.
2. ``PODIUM_WORKER_THREADS`` (the operator's count for this host's instances).
3. The package's ``worker_threads`` (manifest).
4. ``auto`` (above).

A count N binds the worker to the instance's first N cores (capped to the cores it has). One
thread on an instance of at most 2 cores leaves vLLM's auto binding, which is exactly that.
The worker is still forked from the engine core with any of these (`podium.preload.worker`
binds a team of several threads).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("podium.backends.vllm")
AUTO = "auto"
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
THREADS_ENV = "PODIUM_WORKER_THREADS"
ALL_CORES_UP_TO = 2
"""`auto` binds every core of an instance with at least 2 and at most this many (measured on
2; a larger set keeps vLLM's reserved core until measured there)."""


@dataclass(frozen=True)
class WorkerThreads:
    """The worker's threads as chosen, and why."""

    threads: int | None
    """Its OpenMP team size (None: vLLM's own binding decides)."""
    bind: str | None
    """The ``VLLM_CPU_OMP_THREADS_BIND`` Podium sets (None: it leaves the variable alone)."""
    reason: str

    def describe(self, package_key: str) -> str:
        team = (f"{self.threads} thread(s) on CPU(s) {self.bind}" if self.bind
                else "vLLM's own binding")
        return f"engine worker of {package_key}: {team} ({self.reason})"


def parse(raw: str | int, where: str) -> int | str:
    """`auto` or a count of at least 1; ValueError naming `where` otherwise."""
    if raw == AUTO:
        return AUTO
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise ValueError(f"{where}={raw!r}: use auto or a number of threads (at least 1)")
    return value


def choose(requested: int | str, environ: Mapping[str, str], cpus: Iterable[int],
           siblings: Callable[[int], frozenset[int]] | None = None) -> WorkerThreads:
    """The worker's threads for a package asking `requested` (its `worker_threads`), on an
    instance whose CPU set is `cpus`, in `environ`."""
    if environ.get(BIND_ENV):
        return WorkerThreads(None, None, f"{BIND_ENV}={environ[BIND_ENV]!r} is set (the "
                                         "operator's, or the runtime's for instances sharing "
                                         "the machine)")
    from podium import env

    source = "the package's worker_threads"
    operator = env.worker_threads(environ)
    if operator is not None:
        requested, source = parse(operator, THREADS_ENV), THREADS_ENV
    found = cores(cpus, siblings or core_siblings)
    if requested == AUTO:
        if 2 <= len(found) <= ALL_CORES_UP_TO:
            return _bound(found, len(found), f"auto: all {len(found)} cores of the instance "
                                             "(measured faster than one reserved)")
        return WorkerThreads(None, None, f"auto: the instance has {len(found)} core(s); vLLM "
                                         "reserves one for its engine core where it has more "
                                         "than one")
    assert isinstance(requested, int)
    if requested == 1 and len(found) <= 2:
        return WorkerThreads(None, None, f"{source}=1: vLLM's auto binding is one thread")
    threads = min(requested, len(found))
    capped = f", capped to the instance's {len(found)} core(s)" if threads < requested else ""
    return _bound(found, threads, f"{source}={requested}{capped}")


def _bound(found: list[int], threads: int, reason: str) -> WorkerThreads:
    return WorkerThreads(threads, ",".join(map(str, found[:threads])), reason)


def cores(cpus: Iterable[int], siblings: Callable[[int], frozenset[int]]) -> list[int]:
    """One logical CPU per physical core among `cpus` (the lowest of its siblings there), in
    order: a hyperthread sibling is no second compute thread (vLLM's auto drops them too)."""
    allowed = sorted(set(cpus))
    taken: set[int] = set()
    picked = []
    for cpu in allowed:
        if cpu in taken:
            continue
        picked.append(cpu)
        taken |= siblings(cpu) & set(allowed)
    return picked


def core_siblings(cpu: int) -> frozenset[int]:
    """The logical CPUs sharing `cpu`'s physical core (Linux sysfs; just `cpu` if unknown)."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        text = path.read_text().strip()
    except OSError:
        return frozenset({cpu})
    from podium.preload.waits import bound_cpus  # the same Linux CPU-list form ("0,64", "0-1")

    return frozenset((bound_cpus(text) or set()) | {cpu})


def resolve(requested: int | str, package_key: str) -> WorkerThreads:
    """The worker's threads for this instance (its CPU set, this environment), logged."""
    try:
        chosen = choose(requested, os.environ, os.sched_getaffinity(0))
    except ValueError as exc:
        from podium.errors import BootError

        raise BootError(str(exc)) from None
    log.info("%s", chosen.describe(package_key))
    return chosen


@contextlib.contextmanager
def environment(chosen: WorkerThreads | None,
                environ: MutableMapping[str, str] | None = None) -> Iterator[None]:
    """The binding in the environment while the engine starts (its processes copy it), and
    gone after: the server's environment, and a second engine's choice, stay as they were."""
    environ = os.environ if environ is None else environ
    if chosen is None or chosen.bind is None:
        yield
        return
    before = environ.get(BIND_ENV)
    environ[BIND_ENV] = chosen.bind
    try:
        yield
    finally:
        if before is None:
            environ.pop(BIND_ENV, None)
        else:
            environ[BIND_ENV] = before
