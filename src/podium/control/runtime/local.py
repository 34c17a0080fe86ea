"""Instances as local `podium serve` processes, each on its own free ports.

`poll()` is the whole loop, called every second or so by the control plane: a started process
becomes ready when `GET /health/ready` answers 200 (then the gateway routes to it); a process
that exits unasked is a crash (counted, then restarted); a draining one is stopped once the
gateway shows no request in flight on it (or after `drain_timeout_s`). Logs go to one file per
instance. Instances are recorded in the store, so a restarted control plane adopts the live ones
instead of orphaning them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from podium.control.runtime.base import (
    DRAINING,
    FAILED,
    READY,
    STARTING,
    STOPPED,
    InstanceView,
)
from podium.control.store import Store
from podium.gateway.routing import Endpoint, RouteTable

CommandFor = Callable[[str, int, int], list[str]]


def serve_command(package: str, http_port: int, grpc_port: int) -> list[str]:
    """`podium serve PACKAGE` on the given ports, bound to loopback (the gateway faces out)."""
    return [sys.executable, "-m", "podium.cli", "serve", package, "--host", "127.0.0.1",
            "--http-port", str(http_port), "--grpc-port", str(grpc_port)]


def free_port() -> int:
    """A port the kernel considers free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class _Instance:
    id: str
    model: str
    version: str
    http_port: int
    grpc_port: int
    log_path: Path
    db_id: int
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    state: str = STARTING
    started_s: float = field(default_factory=time.monotonic)
    drain_since_s: float | None = None
    num_restarts: int = 0
    log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def exit_code(self) -> int | None:
        """The exit status once the process is gone, None while it runs."""
        if self.process is not None:
            return self.process.poll()
        return None if self.pid is not None and _pid_alive(self.pid) else -1


class LocalRuntime:
    """Runs instances as child processes; routes ready ones through a gateway route table."""

    def __init__(self, store: Store, table: RouteTable, workdir: Path, *,
                 command: CommandFor = serve_command, max_restarts: int = 5,
                 drain_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 probe_timeout_s: float = 1.0, boot_nice: int = 10) -> None:
        self.store = store
        self.table = table
        self.workdir = workdir
        self.command = command
        self.max_restarts = max_restarts
        self.drain_timeout_s = drain_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.boot_nice = boot_nice
        self._probe = httpx.Client(timeout=probe_timeout_s)
        self._instances: dict[str, _Instance] = {}
        self._desired: dict[tuple[str, str], int] = {}
        self._crashes: dict[tuple[str, str], int] = {}
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._adopt()

    # the Runtime interface ---------------------------------------------------------------

    def scale(self, model: str, version: str, count: int) -> None:
        """Start or drain instances until `count` of model@version are wanted."""
        self._desired[(model, version)] = count
        live = [i for i in self._instances.values()
                if (i.model, i.version) == (model, version) and i.state in (STARTING, READY)]
        for _ in range(count - len(live)):
            self._start(model, version)
        # drain the ones not serving yet first, then the newest
        surplus = sorted(live, key=lambda i: (i.state == READY, i.started_s))[
            :max(0, len(live) - count)]
        for instance in surplus:
            self._drain(instance)

    def poll(self) -> None:
        """One pass over every instance; cheap enough to call every second."""
        for instance in list(self._instances.values()):
            if instance.state == STOPPED:
                del self._instances[instance.id]  # the store keeps its history
                continue
            code = instance.exit_code()
            if instance.state == DRAINING:
                self._continue_drain(instance, code)
            elif code is not None:
                self._crashed(instance, code)
            elif instance.state == STARTING and self._ready(instance):
                _renice(instance.pid, 0)
                self._set_state(instance, READY)
                self.table.add_endpoint(instance.model, instance.version, Endpoint(
                    instance.id, instance.url,
                    grpc_target=f"127.0.0.1:{instance.grpc_port}" if instance.grpc_port else None))
            elif instance.state == READY:
                with contextlib.suppress(KeyError):
                    self.table.endpoint(instance.id).healthy = self._ready(instance)

    def instances(self, model: str | None = None,
                  version: str | None = None) -> list[InstanceView]:
        """Instances that are not stopped, optionally of one model/version."""
        return [InstanceView(i.id, i.model, i.version, i.state, i.url, i.pid, i.num_restarts,
                             str(i.log_path))
                for i in self._instances.values()
                if (model is None or i.model == model) and (version is None or i.version == version)
                and i.state != STOPPED]

    def num_crashes(self, model: str, version: str) -> int:
        """Unrequested exits of model@version's instances since this runtime started."""
        return self._crashes.get((model, version), 0)

    def close(self) -> None:
        """Stop every instance now (drain first, bounded by drain_timeout_s)."""
        for key in list(self._desired):
            self.scale(*key, 0)
        deadline = time.monotonic() + self.drain_timeout_s + self.stop_timeout_s
        while self._instances:
            self.poll()
            if time.monotonic() > deadline:
                for instance in self._instances.values():
                    self._stop(instance, force=True)
                    self._set_state(instance, STOPPED)
                break
            time.sleep(0.05)
        self._probe.close()

    # lifecycle ---------------------------------------------------------------------------

    def _start(self, model: str, version: str, previous: _Instance | None = None) -> _Instance:
        package = self.store.get_package(model, version)
        http_port, grpc_port = free_port(), free_port()
        if previous is None:
            db_id = self.store.add_instance(model, version, state=STARTING)
            name = f"{model}-{version}-{db_id}"
            instance = _Instance(name, model, version, http_port, grpc_port,
                                 self.workdir / "logs" / f"{name}.log", db_id)
        else:
            instance = previous
            instance.http_port, instance.grpc_port = http_port, grpc_port
            instance.started_s, instance.state = time.monotonic(), STARTING
        instance.log = instance.log_path.open("ab")
        # boot at low CPU priority: a starting instance must not slow the ones serving traffic
        nice = ["nice", "-n", str(self.boot_nice)] if self.boot_nice else []
        instance.process = subprocess.Popen(
            [*nice, *self.command(package.location, http_port, grpc_port)], stdout=instance.log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)  # survives a control-plane crash; adopted on restart
        instance.pid = instance.process.pid
        self._instances[instance.id] = instance
        self.store.update_instance(instance.db_id, state=STARTING, pid=instance.pid,
                                   http_port=http_port, grpc_port=grpc_port,
                                   log_path=str(instance.log_path),
                                   num_restarts=instance.num_restarts)
        return instance

    def _crashed(self, instance: _Instance, code: int) -> None:
        key = (instance.model, instance.version)
        self._crashes[key] = self._crashes.get(key, 0) + 1
        self.table.remove_endpoint(instance.id)
        _close(instance)
        self._note(instance, f"exited with status {code}")
        if instance.num_restarts >= self.max_restarts:
            self._set_state(instance, FAILED)
            instance.state = STOPPED  # no longer counts as live; FAILED is kept in the store
            return
        instance.num_restarts += 1
        self._start(instance.model, instance.version, previous=instance)

    def _drain(self, instance: _Instance) -> None:
        instance.drain_since_s = time.monotonic()
        with contextlib.suppress(KeyError):
            self.table.drain(instance.id)
        self._set_state(instance, DRAINING)

    def _continue_drain(self, instance: _Instance, code: int | None) -> None:
        if code is None:
            try:
                in_flight = self.table.endpoint(instance.id).num_in_flight
            except KeyError:
                in_flight = 0
            waited = time.monotonic() - (instance.drain_since_s or 0)
            if in_flight > 0 and waited < self.drain_timeout_s:
                return
            self._stop(instance, force=False)
            return
        self.table.remove_endpoint(instance.id)
        _close(instance)
        self._set_state(instance, STOPPED)

    def _stop(self, instance: _Instance, *, force: bool) -> None:
        """SIGTERM (the server finishes its own in-flight work), SIGKILL if it lingers."""
        if instance.pid is None or instance.exit_code() is not None:
            return
        waited = time.monotonic() - (instance.drain_since_s or time.monotonic())
        sig = signal.SIGKILL if force or waited > self.drain_timeout_s + self.stop_timeout_s \
            else signal.SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.kill(instance.pid, sig)

    def _ready(self, instance: _Instance) -> bool:
        try:
            return self._probe.get(instance.url + "/health/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def _set_state(self, instance: _Instance, state: str) -> None:
        instance.state = state
        self.store.update_instance(instance.db_id, state=state,
                                   num_restarts=instance.num_restarts)

    def _note(self, instance: _Instance, message: str) -> None:
        self.store.record_event("instance", f"{instance.id}: {message}", model=instance.model)

    def _adopt(self) -> None:
        """Take over instances a previous control plane left running; mark dead ones stopped."""
        for model, version, row in self.store.list_instances():
            if row.pid is None or row.http_port is None or not _pid_alive(row.pid):
                self.store.update_instance(row.id, state=STOPPED)
                continue
            instance = _Instance(f"{model}-{version}-{row.id}", model, version, row.http_port,
                                 row.grpc_port or 0, Path(row.log_path or os.devnull), row.id,
                                 pid=row.pid, state=STARTING, num_restarts=row.num_restarts)
            self._instances[instance.id] = instance
            self._desired[(model, version)] = self._desired.get((model, version), 0) + 1
            if row.state == DRAINING:
                self._drain(instance)


def _close(instance: _Instance) -> None:
    if instance.log is not None:
        instance.log.close()
        instance.log = None


def _renice(pid: int | None, nice: int) -> None:
    """Set every thread of a process to `nice` (Linux niceness is per thread)."""
    if pid is None:
        return
    with contextlib.suppress(OSError):  # lowering niceness needs privileges; then it stays
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); it is dead for our purposes
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True
