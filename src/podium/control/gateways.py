"""`podium up`'s gateway processes: started in their own sessions, restarted when they die,
adopted by the next `podium up` after a crash, drained and stopped by a clean stop.

Each gateway has a record (`$PODIUM_HOME/gateways/gateway-N.json`: pid and command line). It is
written before the process may start (the same pipe gate as instances, `runtime.detached`),
so a control plane that dies in between leaves no unrecorded gateway; a restarted `podium up`
adopts a recorded gateway that still runs the same command, and replaces one that does not
(another port, key or limit: the old one drains while the new one binds beside it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from podium.control.runtime.detached import open_gate, spawn_gated
from podium.errors import InvalidArgument

log = logging.getLogger("podium.control")
RESTART_AFTER_S = 1.0
"""Least time between two starts of one gateway (a gateway that cannot start must not spin)."""


@dataclass
class _Gateway:
    name: str
    command: list[str]
    pid: int | None = None
    process: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0
    num_restarts: int = 0


# keys podium up itself was given by environment: a gateway gets only what `secrets` says
_KEY_VARIABLES = frozenset({"PODIUM_API_KEY", "PODIUM_ADMIN_KEY", "PODIUM_INTERNAL_KEY",
                            "PODIUM_GATEWAY_KEYS"})


class GatewayProcesses:
    """Keeps `len(commands)` gateway processes running, whoever started them."""

    def __init__(self, home: Path, commands: list[list[str]], *,
                 secrets: dict[str, str] | None = None,
                 note: Callable[[str], None] = lambda message: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dir = home / "gateways"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.secrets = dict(secrets or {})
        """Environment variables only a gateway gets (keys, the plane's credential)."""
        self.fingerprint = hashlib.sha256(json.dumps(self.secrets, sort_keys=True).encode()
                                          ).hexdigest()[:16]
        self.note = note
        self.clock = clock
        """Seconds, monotonic: restarts are spaced on it."""
        self._gateways = [_Gateway(f"gateway-{i}", c) for i, c in enumerate(commands)]
        self._stopping = False

    def adopt(self, *, host: str, port: int) -> None:
        """Adopt the recorded gateways still running this command, retire the others; refuse
        (InvalidArgument) a gateway port some other process listens on."""
        adopted = [g for g in self._gateways if self._adopt(g)]
        for record in self.dir.glob("gateway-*.json"):  # more than asked for now: retire them
            if record.stem not in {g.name for g in self._gateways}:
                self._retire(record)
        if not adopted and self._gateways:
            _check_port_free(host, port)  # a stranger there would share it (SO_REUSEPORT)

    def start(self) -> None:
        """Start every gateway not adopted."""
        for gateway in self._gateways:
            if gateway.pid is None:
                self._spawn(gateway)

    def poll(self) -> None:
        """Restart any gateway whose process is gone (not once the stop began)."""
        for gateway in self._gateways:
            if self._stopping:
                return
            if gateway.pid is not None and not self._running(gateway):
                if self.clock() - gateway.started_s < RESTART_AFTER_S:
                    continue
                code = gateway.process.poll() if gateway.process else None
                gateway.num_restarts += 1
                message = (f"{gateway.name} (pid {gateway.pid}) exited"
                           f"{f' with status {code}' if code is not None else ''}; restarted "
                           f"(restart {gateway.num_restarts})")
                self._spawn(gateway)
                log.warning("%s", message)
                try:
                    self.note(message)
                except Exception:  # the store may be away: the restart matters, not the event
                    log.exception("could not record: %s", message)

    def pids(self) -> list[int]:
        """Pids of the gateway processes."""
        return [g.pid for g in self._gateways if g.pid is not None]

    def terminate(self) -> None:
        """SIGTERM every gateway: each stops taking connections and drains (returns at once);
        none is restarted from now on."""
        self._stopping = True
        for gateway in self._gateways:
            if gateway.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(gateway.pid, signal.SIGTERM)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM every gateway (each drains its in-flight requests), kill the ones still
        running after `timeout_s`, forget their records."""
        self.terminate()
        deadline = time.monotonic() + timeout_s
        while any(self._running(g) for g in self._gateways) and time.monotonic() < deadline:
            time.sleep(0.05)
        for gateway in self._gateways:
            if gateway.pid is not None and self._running(gateway):
                log.warning("%s (pid %d) did not stop in time; killed", gateway.name,
                            gateway.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(gateway.pid, signal.SIGKILL)
            with contextlib.suppress(FileNotFoundError):
                self._record(gateway.name).unlink()
            gateway.pid = None

    # -----------------------------------------------------------------------------------

    def _record(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def _adopt(self, gateway: _Gateway) -> bool:
        record = self._read(self._record(gateway.name))
        if record is None:
            return False
        if record.get("fingerprint") == self.fingerprint and _runs(record["pid"],
                                                                   gateway.command):
            gateway.pid, gateway.started_s = record["pid"], self.clock()
            log.info("adopted %s (pid %d)", gateway.name, gateway.pid)
            return True
        self._retire(self._record(gateway.name))
        return False

    def _retire(self, path: Path) -> None:
        """Stop a recorded gateway this plane does not want (it drains on its own)."""
        record = self._read(path)
        if record is not None and _runs(record["pid"], record["command"]):
            log.info("replacing %s (pid %d): it runs another command", path.stem,
                     record["pid"])
            with contextlib.suppress(ProcessLookupError):
                os.kill(record["pid"], signal.SIGTERM)
        path.unlink(missing_ok=True)

    def _spawn(self, gateway: _Gateway) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _KEY_VARIABLES}
        env.update(self.secrets)  # never on the command line (`ps` shows it)
        with (self.dir / f"{gateway.name}.log").open("ab") as out:
            process = spawn_gated(gateway.command, out=out, env=env)
        gateway.process, gateway.pid, gateway.started_s = process, process.pid, self.clock()
        open_gate(process, lambda: self._record(gateway.name).write_text(json.dumps({
            "pid": process.pid, "command": gateway.command, "fingerprint": self.fingerprint})))
        log.info("started %s (pid %d)", gateway.name, process.pid)

    def _running(self, gateway: _Gateway) -> bool:
        if gateway.pid is None:
            return False
        if gateway.process is not None:
            return gateway.process.poll() is None
        return _runs(gateway.pid, gateway.command)

    @staticmethod
    def _read(path: Path) -> dict | None:
        try:
            record = json.loads(path.read_text())
            return record if isinstance(record.get("pid"), int) else None
        except (OSError, ValueError, AttributeError):
            return None


def _runs(pid: int, command: list[str]) -> bool:
    """`pid` is alive and runs exactly `command` (not a stranger that reused the pid)."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.cmdline() == command
    except psutil.Error:
        return False


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise InvalidArgument(f"the gateway port {host}:{port} is in use ({exc.strerror}) "
                                  "by a process this podium up did not start; stop it or "
                                  "choose another --http-port", param="http_port") from None
