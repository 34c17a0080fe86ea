"""The engine core's worker, forked from the engine core (itself forked from the preloader)
instead of spawned, when its OpenMP threads can be bound exactly as a spawned worker's are.

A spawned worker imports vLLM again (~9-12 s here). vLLM's CPU executor binds a spawned
worker's OpenMP threads through the environment it starts with (`OMPProcessManager`:
``GOMP_CPU_AFFINITY``, ``OMP_PLACES``/``OMP_PROC_BIND`` or ``KMP_AFFINITY``, and
``OMP_NUM_THREADS``), which the OpenMP runtime reads when it loads. A forked worker has the
runtime already loaded (by the preloader), so those variables do nothing there: forked
naively, its threads floated over every core and a 16-chat load ran slow.

So a forked worker binds its team itself, as the runtime would have from the variables, before
vLLM's code runs: one thread per CPU of the binding vLLM set (it always writes one per CPU),
the main thread (the team's thread 0) and every thread it starts later on the first CPU
(`os.sched_setaffinity`, inherited by new threads), torch's pool sized to the CPUs, then one
parallel region (`GOMP_parallel`) in which team thread i binds itself to the i-th CPU. The
runtime keeps those threads for every later region of the main thread, in the same order, as
libgomp with ``GOMP_CPU_AFFINITY`` does (a spawned worker's threads were measured bound the same:
main thread and helpers on the first CPU, thread i on the i-th). A one-CPU binding needs no
region. Anything else (no binding, a range, several workers, a binding variable set before the
preloader started, a runtime without `GOMP_parallel`) is spawned as vLLM does it, with the
reason logged.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from multiprocessing import context, popen_fork, popen_spawn_posix
from pathlib import Path
from typing import Any

log = logging.getLogger("vllm.podium.preload")
"""Under vLLM's logger: this runs in the engine core, whose logging vLLM set up."""
BINDING = ("GOMP_CPU_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "KMP_AFFINITY", "OMP_NUM_THREADS")
"""The variables vLLM's executor sets for a worker it starts (`OMPProcessManager`)."""
_inherited: dict[str, str] = {}
"""The binding variables the engine core's environment had before vLLM set its worker's."""


def install(env: Mapping[str, str]) -> None:
    """In an engine core forked from the preloader, before vLLM runs: its executor starts
    workers through `WorkerContext` (when the preloader imported the executor)."""
    global _inherited
    _inherited = {k: env[k] for k in BINDING if k in env}
    from podium import env as podium_env

    executor = sys.modules.get("vllm.v1.executor.multiproc_executor")  # the preloader's import
    if not podium_env.preload_worker_fork(env) or executor is None:
        return  # the worker is spawned, as vLLM does it
    executor.get_mp_context = _worker_context  # type: ignore[assignment]


def _worker_context() -> context.BaseContext:
    from vllm.utils.system_utils import get_mp_context

    found = get_mp_context()  # vLLM's own checks (Ray, NUMA binding, ...) run as before
    return WorkerContext() if found.get_start_method() == "spawn" else found


def fork_plan(env: Mapping[str, str], world_size: int) -> tuple[list[int] | None, str]:
    """(the CPUs to bind a forked worker's OpenMP team to, one thread each, "") or
    (None, why it is spawned)."""
    if world_size != 1:
        return None, f"{world_size} workers (each would inherit the others' pipes)"
    if _inherited:
        return None, (f"{', '.join(sorted(_inherited))} set before the preloader started "
                      "(its OpenMP runtime read them)")
    cpus = _cpus(env)
    threads = env.get("OMP_NUM_THREADS")
    if cpus is None or threads is None:
        return None, "vLLM set no OpenMP binding for it"
    if not cpus or threads != str(len(cpus)) or len(set(cpus)) != len(cpus):
        return None, (f"its OpenMP binding is {len(cpus)} CPU(s), {threads} thread(s): only "
                      "one thread per CPU is bound exactly without the runtime reading the "
                      "environment")
    if len(cpus) > 1 and _runtime() is None:
        return None, "the OpenMP runtime has no GOMP_parallel to bind a team of threads with"
    return cpus, ""


def _cpus(env: Mapping[str, str]) -> list[int] | None:
    """The CPUs of the binding vLLM set: `GOMP_CPU_AFFINITY` ("0 1"), `OMP_PLACES` ("{0,1}"),
    or `KMP_AFFINITY`'s proclist ("granularity=fine,explicit,proclist=[0,1]")."""
    raw = env.get("GOMP_CPU_AFFINITY")
    if raw is None and "OMP_PLACES" in env:
        raw = env["OMP_PLACES"].strip("{}")
    if raw is None and "KMP_AFFINITY" in env:
        found = re.search(r"proclist=\[([^\]]*)\]", env["KMP_AFFINITY"])
        raw = found.group(1) if found else None
    if raw is None:
        return None
    try:
        return [int(x) for x in re.split(r"[\s,]+", raw.strip()) if x]
    except ValueError:  # a range or a stride: not what vLLM writes; spawn
        return None


def enter_worker(cpus: list[int], target: Callable[..., Any], *args: Any,
                 **kwargs: Any) -> Any:
    """Run in the forked worker first: bind its OpenMP team to `cpus` (`bind_team`), its
    process name, then vLLM's target."""
    _name("VLLM::Worker")  # vLLM's default prefix; its own title below replaces it
    executor = sys.modules.get("vllm.v1.executor.multiproc_executor")
    if executor is not None:  # vLLM titles the worker again as it starts: name it the same
        executor.set_process_title = _naming(executor.set_process_title)
    bind_team(cpus)
    return target(*args, **kwargs)


def bind_team(cpus: list[int]) -> None:
    """Bind this process's main thread (and the threads it starts later) to `cpus[0]`, size
    torch's OpenMP pool to one thread per CPU and bind team thread i to `cpus[i]`. In a
    forked worker only: the pool was sized, never run, in the engine core (no deadlock)."""
    os.sched_setaffinity(0, {cpus[0]})
    import torch

    torch.set_num_threads(len(cpus))
    if len(cpus) == 1:
        return
    runtime = _runtime()
    assert runtime is not None  # fork_plan checked it
    region = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def bind(_: Any) -> None:  # in each team thread, with the GIL (ctypes takes it)
        os.sched_setaffinity(0, {cpus[runtime.omp_get_thread_num()]})

    callback = region(bind)
    runtime.GOMP_parallel(callback, None, ctypes.c_uint(len(cpus)), ctypes.c_uint(0))


OPENMP_LIBS = ("libgomp", "libiomp5", "libomp")
"""The OpenMP runtimes whose ``GOMP_parallel`` binds a team (Intel's and LLVM's have it too)."""


def _runtime() -> Any:
    """The OpenMP runtime this process has loaded (preloaded, or torch's own), as ctypes sees
    it, or None when none is loaded or it has no `GOMP_parallel`."""
    for path in [None, *_loaded(OPENMP_LIBS)]:
        try:
            found = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY) if path else \
                ctypes.CDLL(None)
        except OSError:
            continue
        if hasattr(found, "GOMP_parallel") and hasattr(found, "omp_get_thread_num"):
            found.omp_get_thread_num.restype = ctypes.c_int
            return found
    return None


def _loaded(names: tuple[str, ...]) -> list[str]:
    """Paths of this process's mapped shared libraries whose file name starts with one of
    `names`."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = {line.split()[-1] for line in maps.splitlines() if "/" in line}
    return sorted(p for p in paths if os.path.basename(p).startswith(names))


def _name(name: str) -> None:
    """The process's name (`comm`, what `ps` and psutil show) as vLLM titles a spawned worker:
    its own `setproctitle` leaves a forked child named after the preloader, and tools find
    the worker (and so its engine core) by this name (`tests/support/engine_count.py`)."""
    pr_set_name = 15
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_name, name.encode()[:15], 0, 0, 0)


def _naming(set_title: Callable[..., None]) -> Callable[..., None]:
    """vLLM's `set_process_title(name, suffix, prefix)`, then the process's name set to the
    title it means (`prefix::name[_suffix]`). setproctitle cannot set it in a forked child
    (its `getproctitle()` is empty there). Naming never fails the worker's start."""
    import inspect

    signature = inspect.signature(set_title)

    def titled(*args: Any, **kwargs: Any) -> None:
        set_title(*args, **kwargs)
        with contextlib.suppress(Exception):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            name, suffix, prefix = (bound.arguments.get(k, "") for k in ("name", "suffix",
                                                                       "prefix"))
            if name:
                _name(f"{prefix}::{name}_{suffix}" if suffix else f"{prefix}::{name}")

    return titled


class WorkerProcess(context.SpawnProcess):
    """vLLM's worker process: forked and bound when `fork_plan` allows it, else spawned."""

    _start_method = "spawn"
    pipe_fds: list[int] = []
    """Every pipe end its context made so far (`WorkerContext.Pipe`)."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        config = process_obj._kwargs.get("vllm_config")
        world_size = config.parallel_config.world_size if config is not None else 0
        cpus, why = fork_plan(os.environ, world_size)
        if cpus is None:
            log.info("engine worker spawned: %s", why)
            return popen_spawn_posix.Popen(process_obj)
        log.info("engine worker forked from the engine core, its OpenMP team bound to CPU(s) "
                 "%s, one thread each", ",".join(map(str, cpus)))
        # A forked child holds every pipe end of its parent: vLLM (told "spawn") passes none
        # for it to close, and a worker holding its own death pipe's write end would never see
        # the engine core die. Its worker_main closes what `inherited_fds` names.
        kwargs = process_obj._kwargs
        own = {c.fileno() for c in (kwargs.get("ready_pipe"), kwargs.get("death_pipe"))
               if c is not None}
        kwargs["inherited_fds"] = [*kwargs.get("inherited_fds", []),
                                   *(fd for fd in process_obj.pipe_fds if fd not in own)]
        process_obj._target = functools.partial(enter_worker, cpus, process_obj._target)
        return popen_fork.Popen(process_obj)


class WorkerContext(context.SpawnContext):
    """A spawn context whose processes fork when they can (`WorkerProcess`). vLLM makes one
    per worker (`get_mp_context` in `make_worker_process`), its two pipes, then the process."""

    def __init__(self) -> None:
        super().__init__()
        self.pipe_fds: list[int] = []

    def Pipe(self, duplex: bool = True) -> tuple[Any, Any]:
        ends = super().Pipe(duplex)
        self.pipe_fds += [end.fileno() for end in ends]
        return ends

    def Process(self, *args: Any, **kwargs: Any) -> WorkerProcess:  # type: ignore[override]
        process = WorkerProcess(*args, **kwargs)
        process.pipe_fds = list(self.pipe_fds)
        return process
