"""Instances as local `podium serve` processes, each on its own free ports.

The instance lifecycle (readiness, crash restart, drain) is the `Supervisor`'s; this file starts
processes, one log file per instance, at low CPU priority until they are ready. Instances are
recorded in the store with their pid and ports, so a restarted control plane adopts the live
ones instead of orphaning them.

No instance can outlive a control-plane crash unrecorded: its ports are written before it is
spawned, and it is spawned behind the gate of `runtime.detached`, opened only once its pid is
in the store.

On a CPU host a lone vLLM instance (the only one live or wanted) is left unbound: its server
chooses its worker's threads (`podium.backends.vllm.worker_threads`: every core of a 2-core
machine). Beside others, each instance gets its own core for vLLM's worker
(`VLLM_CPU_OMP_THREADS_BIND`): vLLM's `auto` binding pins every engine's worker to the first
core, so two instances of one LLM on a 2-core machine would share core 0 and leave core 1 to
their frontends. A lone instance that gets company keeps its cores (its team is bound at its
boot); the newcomer takes the core the fewest instances use. The operator's own
`VLLM_CPU_OMP_THREADS_BIND`, when set, is passed through untouched.

vLLM instances fork from the runtime's zygote (`podium.preload.zygote`), started early: when
the runtime starts with a vLLM deployment in its store, and when one is scaled (to zero too).
A launch that finds it still importing is deferred, not waited for (this runs in the control
plane's loop): the instance stays starting, its event says it waits for the zygote's import,
and a later pass (`_refresh`) launches it once the zygote is ready, forked, or plain when the
zygote exited meanwhile or `zygote_wait_s` passed (the reason in its event).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.control.models import PackageRow
from podium.control.runtime.base import DRAINING, READY, STARTING, STOPPED
from podium.control.runtime.detached import open_gate, pid_alive, spawn_gated
from podium.control.runtime.supervisor import Instance, Supervisor
from podium.control.store import Store, StoreUnavailable
from podium.credential import instance_env
from podium.ports import free_port
from podium.preload.spawn import Zygote
from podium.routes.table import RouteTable

log = logging.getLogger("podium.control")
CommandFor = Callable[[str, int, int], list[str]]
def serve_command(package: str, http_port: int, grpc_port: int, *,
                  host: str = "127.0.0.1") -> list[str]:
    """`podium serve PACKAGE` on the given ports, bound to `host` (loopback: the gateway faces
    out)."""
    return [sys.executable, "-m", "podium.cli", "serve", package, "--host", host,
            "--http-port", str(http_port), "--grpc-port", str(grpc_port)]


BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
ZYGOTE_WAIT_S = 60.0
"""How long a vLLM instance's launch waits at most for the zygote's import (7-11 s on 2 cores,
as long as a plain server's own); longer means the zygote is in trouble: it starts plain."""


@dataclass(frozen=True)
class _Wait:
    """A launch deferred until the zygote has imported the engine."""

    package: PackageRow
    since_s: float
    zygote_starts: int
    """The zygote's `starts` then: another value later means it exited meanwhile."""


@dataclass
class _Process(Instance):
    process: subprocess.Popen[bytes] | None = None
    cpu: int | None = None
    """The core its engine's worker is bound to (None: the operator's binding, or adopted)."""
    every_core: bool = False
    """Launched alone and unbound: its worker's threads may be on every core."""
    waits: _Wait | None = None
    """Its launch waits for the zygote's import (`LocalRuntime._refresh` launches it)."""


BOOT_NICE = 10
"""CPU niceness of a booting instance: it must not slow the instances serving traffic."""
SERVE_NICE = 5
"""CPU niceness of a serving instance: below the gateways and the control plane (0), so a
saturated instance never starves the process that refuses work for it. With an xgb instance and
its gateway on one core at 4x the instance's capacity, the gateway's refusals took 8 ms
(median) and 63 ms (p99) with the instance at 0, 0.7 ms and 11-17 ms with it at 5
(docs/benchmarks.md, `bench/overload_xgb.py`)."""


class LocalRuntime(Supervisor[_Process]):
    """Runs instances as child processes; routes ready ones through a gateway route table."""

    def __init__(self, store: Store, table: RouteTable, workdir: Path, *,
                 command: CommandFor = serve_command, max_restarts: int = 5,
                 drain_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 probe_timeout_s: float = 1.0, boot_nice: int = BOOT_NICE,
                 serve_nice: int = SERVE_NICE, credential: str | None = None,
                 zygote: Zygote | None = None,
                 zygote_backends: tuple[str, ...] = ("vllm",),
                 zygote_wait_s: float = ZYGOTE_WAIT_S) -> None:
        super().__init__(store, table, max_restarts=max_restarts,
                         drain_timeout_s=drain_timeout_s, stop_timeout_s=stop_timeout_s,
                         probe_timeout_s=probe_timeout_s, credential=credential)
        self.workdir = workdir
        self.command = command
        self.boot_nice, self.serve_nice = boot_nice, serve_nice
        self.zygote, self.zygote_backends = zygote, zygote_backends
        """Instances of these backends are forked from the zygote (see
        `podium.preload.zygote`), waiting at most `zygote_wait_s` for its import; the others,
        and any it cannot fork, start as processes."""
        self.zygote_wait_s = zygote_wait_s
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._adopt()
        if self._zygotes_deployed():
            self._want_zygotes()  # importing before the first launch asks for it

    def _zygote_backends(self) -> tuple[str, ...]:
        return self.zygote_backends if self.zygote is not None else ()

    def _want_zygotes(self) -> None:
        """The zygote imports from now on (started unless it ever was: one that exited is
        restarted by the next launch, which starts plain)."""
        if self.zygote is not None and self.zygote.process is None:
            self.zygote.start()

    def _create(self, model: str, version: str, db_id: int) -> _Process:
        name = f"{model}-{version}-{db_id}"
        return _Process(name, model, version, db_id,
                        log_path=str(self.workdir / "logs" / f"{name}.log"))

    def _launch(self, instance: _Process, package: PackageRow) -> dict[str, Any]:
        instance.process, instance.waits = None, None
        zygote = self.zygote if self._forks(package) else None
        if zygote is not None:
            self._want_zygotes()  # at the latest now
            if zygote.importing():  # deferred, not waited for: this runs in the plane's loop
                instance.waits = _Wait(package, self.clock(), zygote.starts)
                self._note(instance, "waits for the zygote's import (at most "
                                     f"{self.zygote_wait_s:g} s), then forks from it")
                return {"pid": None}  # no process yet: a plane restarted now drops it
        return self._spawn(instance, package)

    def _refresh(self) -> None:
        """Launch the instances whose wait for the zygote is over."""
        for instance in list(self._instances.values()):
            if (instance.waits is not None and instance.state == STARTING
                    and not self._still_waits(instance.waits)):
                with contextlib.suppress(StoreUnavailable):  # tried again at the next pass
                    self._spawn(instance, instance.waits.package)

    def _still_waits(self, waits: _Wait) -> bool:
        zygote = self.zygote
        return (zygote is not None and zygote.importing() and zygote.starts == waits.zygote_starts
                and self.clock() - waits.since_s < self.zygote_wait_s)

    def _spawn(self, instance: _Process, package: PackageRow) -> dict[str, Any]:
        """Start the instance's process now: forked from the zygote or plain."""
        http_port, grpc_port = free_port(), free_port()
        instance.url = f"http://127.0.0.1:{http_port}"
        instance.grpc_target = f"127.0.0.1:{grpc_port}"
        recorded = {"http_port": http_port, "grpc_port": grpc_port,
                    "log_path": instance.log_path}
        self.store.update_instance(instance.db_id, pid=None, **recorded)  # intended, first
        # boot at low CPU priority: a starting instance must not slow the ones serving traffic
        nice = ["nice", "-n", str(self.boot_nice)] if self.boot_nice else []
        serve = self.command(package.location, http_port, grpc_port)
        command = [*nice, *serve]
        env = instance_env(self.credential)  # by environment: never on a command line
        instance.cpu, instance.every_core = None, False
        if BIND_ENV not in env and _one_cpu_worker(package):
            if self._alone(instance):  # its server's worker_threads rule binds it
                instance.every_core = True
            else:
                instance.cpu = self._free_cpu()
                env[BIND_ENV] = str(instance.cpu)
        with Path(instance.log_path or os.devnull).open("ab") as out:  # the child keeps its copy
            process = self._from_zygote(instance, package, serve, out, env)
            if process is None:
                process = spawn_gated(command, out=out, env=env)
        instance.process, instance.pid = process, process.pid
        open_gate(process, lambda: self.store.update_instance(instance.db_id, pid=process.pid))
        instance.waits = None  # launched (a failed record leaves it to the next pass)
        return {"pid": instance.pid, **recorded}

    def _from_zygote(self, instance: _Process, package: PackageRow, serve: list[str],
                     out: Any, env: dict[str, str]) -> Any:
        """The instance's server forked from the zygote (no import of vLLM on its boot path),
        or None: no zygote, not a backend it serves, or it could not fork it (the reason in
        the instance's event; a zygote gone is restarted for the next instance)."""
        if not self._forks(package) or serve[0] != sys.executable:
            return None  # not a Python command: it cannot run in the zygote's interpreter
        zygote, waits = self.zygote, instance.waits
        assert zygote is not None
        waited_s = 0.0 if waits is None else self.clock() - waits.since_s
        if waits is not None and zygote.starts != waits.zygote_starts:
            why = "the zygote exited and was restarted while this instance waited for it"
        elif waits is not None and zygote.importing():
            why = (f"the zygote was still importing the engine after {waited_s:.0f} s "
                   f"(the bound: {self.zygote_wait_s:g} s)")
            log.warning("zygote bypassed: %s; the instance starts as a plain process", why)
        else:
            process, why = zygote.fork(serve[1:], out=out, env=env, nice=self.boot_nice)
            if process is not None:
                after = f", after waiting {waited_s:.1f} s for its import" if waits else ""
                self._note(instance, f"forked from the zygote (pid {zygote.process.pid}{after})")  # type: ignore[union-attr]
                return process
        self._note(instance, f"started as a plain process: {why}")
        return None

    def _forks(self, package: PackageRow) -> bool:
        """Whether the package's instances fork from the zygote."""
        return package.backend in self._zygote_backends()

    def close(self, timeout_s: float | None = None) -> None:
        zygote, self.zygote = self.zygote, None  # the scale to zero of closing starts none
        super().close(timeout_s)
        if zygote is not None:
            zygote.stop()

    def _free_cpu(self) -> int:
        """The core this process may use that the fewest live instances are bound to (one
        launched alone counts on every core)."""
        cores = sorted(os.sched_getaffinity(0))
        used = [c for i in self._live_bound() for c in ([i.cpu] if i.cpu is not None else cores)]
        return min(cores, key=used.count)

    def _live_bound(self) -> list[_Process]:
        return [i for i in self._instances.values() if (i.cpu is not None or i.every_core)
                and i.state in (STARTING, READY, DRAINING)]

    def _alone(self, instance: _Process) -> bool:
        """No other vLLM instance is live, and at most one is wanted in all."""
        wanted = sum(count for (model, version), count in self._desired.items()
                     if self._backend(model, version) == "vllm")
        return wanted <= 1 and all(i is instance for i in self._live_bound())

    def _exit_code(self, instance: _Process) -> int | None:
        if instance.waits is not None:
            return None  # not launched yet
        if instance.process is not None:
            return instance.process.poll()
        return None if instance.pid is not None and pid_alive(instance.pid) else -1

    def _terminate(self, instance: _Process, *, force: bool) -> None:
        instance.waits = None  # never launched: gone (exit -1) at the next pass
        if instance.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if force:
                # its own session's process group; an engine core is in a group of its own
                # and stops itself once its server is gone (engine_patches.lifecycle)
                try:
                    os.killpg(instance.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    os.kill(instance.pid, signal.SIGKILL)
            else:
                os.kill(instance.pid, signal.SIGTERM)  # the server stops its own children

    def _serving(self, instance: _Process) -> None:
        renice(instance.pid, self.serve_nice)

    def _adopt(self) -> None:
        """Take over instances a previous control plane left running; mark dead ones stopped."""
        for model, version, row in self.store.list_instances():
            if row.pid is None or row.http_port is None or not _is_instance(row.pid,
                                                                               row.http_port):
                # a pid never recorded belongs to a gated process that exited unstarted
                self.store.update_instance(row.id, state=STOPPED)
                continue
            instance = _Process(
                f"{model}-{version}-{row.id}", model, version, row.id,
                url=f"http://127.0.0.1:{row.http_port}",
                grpc_target=f"127.0.0.1:{row.grpc_port}" if row.grpc_port else None,
                pid=row.pid, log_path=row.log_path or os.devnull,
                num_restarts=row.num_restarts)
            self._adopted(instance, row.state)


def _one_cpu_worker(package: PackageRow) -> bool:
    """A vLLM package whose engine runs one worker (a parallel engine binds a core list per
    rank, which vLLM's own `auto` does better than one core)."""
    args = package.manifest.get("engine_args") or {}
    return package.backend == "vllm" and all(
        int(args.get(key) or 1) == 1 for key in
        ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))


def renice(pid: int | None, nice: int) -> None:
    """Set every thread of a process to `nice` (Linux niceness is per thread)."""
    if pid is None:
        return
    with contextlib.suppress(OSError):  # lowering niceness needs privileges; then it stays
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def _is_instance(pid: int, http_port: int) -> bool:
    """`pid` runs and is the instance started on `http_port` (not a stranger that reused
    the pid of one that died while no control plane watched)."""
    if not pid_alive(pid):
        return False
    try:
        # split on spaces too: a server forked from the zygote has its command as its title
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return True  # no /proc to ask: trust the pid
    return str(http_port).encode() in args
