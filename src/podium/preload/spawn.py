"""Talking to a zygote (`podium.preload.zygote`): the runtime's `Zygote` (start it, fork an
instance's server from it) and a forked server's `fork_preloader` (its engine preloader).

A zygote that is not ready yet, crashed or does not answer is never a failed start: `spawn`
returns None (with a warning when it was expected to work) and the runtime starts the instance
as a plain process; the next start starts a new zygote."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from podium.preload.environment import engine_env, load_time_drift

log = logging.getLogger("podium.preload")
ANSWER_TIMEOUT_S = 10.0
"""How long a request waits for the zygote's answer (a fork: milliseconds)."""


class ZygoteProcess:
    """An instance's server forked from a zygote, waiting at its gate (what
    `control.runtime.detached.open_gate` opens). Its exit status is the one the zygote wrote
    when it reaped it; -1 when the zygote is gone too (nobody recorded it)."""

    def __init__(self, pid: int, gate: IO[bytes], exits: Path) -> None:
        self.pid, self.stdin, self.exits = pid, gate, exits
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(OSError, ValueError):
                self.returncode = int((self.exits / str(self.pid)).read_text())
        if self.returncode is None and not alive(self.pid):
            # exited; the zygote writes its status before it frees the pid, unless it is gone
            with contextlib.suppress(OSError, ValueError):
                self.returncode = int((self.exits / str(self.pid)).read_text())
            if self.returncode is None:
                self.returncode = -1
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """As `subprocess.Popen.send_signal`: nothing once it has exited."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class Zygote:
    """One zygote process, started early by its runtime (its import takes as long as a
    server's: the runtime's first instance waits for it, `LocalRuntime`)."""

    def __init__(self, workdir: Path, *, modules: list[str] | None = None,
                 base_env: Mapping[str, str] | None = None, nice: int = 0) -> None:
        self.workdir, self.modules, self.nice = workdir, modules, nice
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.env = engine_env(self.base_env)
        self.process: subprocess.Popen[bytes] | None = None
        self.socket = str(workdir / "zygote.sock")
        self.log_path = workdir / "logs" / "zygote.log"
        self.starts = 0

    def start(self) -> None:
        """Start it (returns at once; it imports in the background)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        modules = ",".join(self.modules) if self.modules is not None else ""
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [*(["nice", "-n", str(self.nice)] if self.nice else []),
                 sys.executable, "-m", "podium.preload.zygote", self.socket, modules],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True)
        self.starts += 1
        log.info("zygote started (pid %d): it imports the engine for the instances to come",
                 self.process.pid)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        return self.alive() and os.path.exists(self.socket)

    def importing(self) -> bool:
        """Started, alive and not ready yet."""
        return self.alive() and not self.ready()

    def spawn(self, argv: list[str], *, out: IO[bytes], env: Mapping[str, str],
              nice: int = 0) -> ZygoteProcess | None:
        """``python ARGV`` forked from the zygote, in its own session, at its gate; None when
        it cannot be (`fork` says why), and the caller starts the instance as a plain
        process."""
        return self.fork(argv, out=out, env=env, nice=nice)[0]

    def fork(self, argv: list[str], *, out: IO[bytes], env: Mapping[str, str],
             nice: int = 0) -> tuple[ZygoteProcess | None, str]:
        """As `spawn`, with why it could not be forked ("" when it was): not ready (started
        now when never started; restarted when it crashed), a load-time environment that
        differs, a fork that failed (the zygote restarted)."""
        if not self.alive():
            if self.process is None:
                self.start()
                return None, "the zygote is starting (importing the engine)"
            why = (f"the zygote (pid {self.process.pid}) exited ({self.process.returncode}); "
                   "it is restarted for the next instances")
            log.warning("%s; this instance starts as a plain process", why)
            self.start()
            return None, why
        if not self.ready():
            return None, "the zygote is still importing the engine"
        drift = load_time_drift(self.env, engine_env(env))
        if drift:
            why = (f"the instance's {', '.join(drift)} differ(s) from the zygote's and are read "
                   "when a library loads")
            log.warning("zygote bypassed: %s; it starts as a plain process", why)
            return None, why
        try:
            return fork_server(self.socket, argv, out=out, env=env, nice=nice), ""
        except (OSError, EOFError, ValueError) as exc:
            why = (f"the zygote (pid {self.process.pid}) did not fork the instance "  # type: ignore[union-attr]
                   f"({exc!r}); it is restarted")
            log.warning("%s; this instance starts as a plain process", why)
            self.stop()
            self.start()
            return None, why

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            process.stdin.close()  # type: ignore[union-attr]  # its signal to exit
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def fork_server(socket_path: str, argv: list[str], *, out: IO[bytes], env: Mapping[str, str],
                nice: int = 0, watch: bool = False) -> ZygoteProcess:
    """``python ARGV`` forked from the zygote listening at `socket_path`, at its gate (raises
    OSError, EOFError or ValueError when the zygote does not answer with a pid). With `watch`
    the child keeps its gate open after "go" and is sent SIGTERM when the gate's writer (the
    returned process's `stdin`) closes (`podium.preload.zygote.watch_gate`)."""
    gate_r, gate_w = os.pipe()
    try:
        request = {"kind": "serve", "argv": argv, "env": dict(env), "cwd": os.getcwd(),
                   "nice": nice, "watch": watch}
        pid = _ask(socket_path, request, [gate_r, out.fileno()])
    except BaseException:
        os.close(gate_w)
        raise
    finally:
        os.close(gate_r)
    with contextlib.suppress(OSError):  # a status of an earlier process of this pid
        os.unlink(f"{socket_path}.exits/{pid}")
    return ZygoteProcess(pid, os.fdopen(gate_w, "wb", buffering=0), Path(f"{socket_path}.exits"))


def fork_preloader() -> tuple[Any, dict[str, str]] | None:
    """In a server forked from a zygote: its engine preloader, forked from the zygote (a
    `multiprocessing` fork server with vLLM already imported), and the environment it has;
    None when the zygote cannot (the caller starts one the usual way)."""
    from multiprocessing import connection, resource_tracker

    from podium.preload import zygote

    if not zygote.forked or zygote.socket_path is None:
        return None
    resource_tracker.ensure_running()
    address = connection.arbitrary_address("AF_UNIX")
    alive_r, alive_w = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            pid = _ask(zygote.socket_path, {"kind": "preloader", "server": os.getpid()},
                       [listener.fileno(), alive_r, sys.stdout.fileno()])
    except (OSError, EOFError, ValueError) as exc:
        os.close(alive_w)
        log.warning("the zygote did not fork the engine preloader (%r): starting one", exc)
        return None
    finally:
        os.close(alive_r)
    server = _zygote_fork_server()()
    server._forkserver_address = address  # type: ignore[attr-defined]
    server._forkserver_alive_fd = alive_w  # type: ignore[attr-defined]
    server._forkserver_pid = pid  # type: ignore[attr-defined]
    return server, dict(zygote.origin_env)


def _zygote_fork_server() -> type:
    from multiprocessing import forkserver, resource_tracker

    class ZygoteForkServer(forkserver.ForkServer):
        """A fork server this process did not start (forked from the zygote, which reaps it):
        its liveness is asked with a signal, not `waitpid`."""

        def ensure_running(self) -> None:
            resource_tracker.ensure_running()
            if self._forkserver_pid is None or not alive(self._forkserver_pid):
                raise OSError(f"the engine preloader (pid {self._forkserver_pid}) is gone")

    return ZygoteForkServer


def _ask(path: str, request: dict[str, Any], fds: list[int]) -> int:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(ANSWER_TIMEOUT_S)
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                raise EOFError("the zygote closed the connection without an answer")
            data += chunk
    reply = json.loads(data)
    if "pid" not in reply:
        raise ValueError(reply.get("error", "no pid in the answer"))
    return int(reply["pid"])


def alive(pid: int) -> bool:
    """Whether `pid` runs (or is a zombie its zygote has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
