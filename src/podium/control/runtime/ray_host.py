"""The Ray actor that hosts one instance: runs `podium serve` on its node.

It runs on whichever node Ray placed it, so everything node-local happens here: picking free
ports, writing the log file, signalling and renicing the process. The server binds the node's
IP (the gateway may be on another node). A vLLM instance's server is forked from the node's
zygote when that is ready (`ray_zygote`; no import of vLLM on its boot path), else started as a
subprocess. Either way it dies with the actor: a subprocess asks the kernel for SIGTERM when
its parent (the actor's worker) goes (PR_SET_PDEATHSIG); a forked server, the zygote's child,
gets SIGTERM when the actor's end of its gate pipe closes (`preload.zygote.watch_gate`). So a
killed actor or a lost node's raylet leaves no server behind. The actor itself is detached
(`RayRuntime`): a control plane that exits leaves it serving, for the next one to adopt.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from podium.control.runtime.local import renice, serve_command
from podium.control.runtime.ray_zygote import fork_on_node, without_ray_threads
from podium.credential import instance_env
from podium.ports import free_port
from podium.preload.spawn import ZygoteProcess

# set PR_SET_PDEATHSIG (1) then exec the command; exit at once if the parent is already gone
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execvp(sys.argv[2], sys.argv[2:])")


class InstanceHost:
    """One `podium serve` process on this node (made a Ray actor by `RayRuntime`)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | ZygoteProcess | None = None
        self.place: dict[str, Any] | None = None
        """Where the server listens and logs, once started (what `start` returned)."""

    def start(self, package: str, log_path: str, boot_nice: int,
              credential: str | None = None,
              zygote: dict[str, Any] | None = None) -> dict[str, Any]:
        """Launch the server on free ports, accepting only `credential` when given, forked
        from the node's zygote when `zygote` (its settings, `ray_zygote.node_zygote`) is
        given and it can; returns where it listens and logs, its pid and how it started."""
        import ray

        host = ray.util.get_node_ip_address()
        http_port, grpc_port = free_port(host), free_port(host)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        serve = serve_command(package, http_port, grpc_port, host=host)
        # the instance's threads are the engine's to size, not Ray's (ray_zygote)
        env = without_ray_threads(instance_env(credential))
        note = ""
        with open(log_path, "ab") as log:
            if zygote is not None:
                self.process, note = fork_on_node(serve[1:], out=log, env=env, nice=boot_nice,
                                                  settings=zygote)
            if self.process is None:
                nice = ["nice", "-n", str(boot_nice)] if boot_nice else []
                command = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *nice,
                           *serve]
                self.process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, env=env)
        context = ray.get_runtime_context()
        self.place = {"url": f"http://{host}:{http_port}", "grpc_target": f"{host}:{grpc_port}",
                      "http_port": http_port, "grpc_port": grpc_port, "pid": self.process.pid,
                      "node": host, "node_id": context.get_node_id(),
                      "actor_id": context.get_actor_id(), "started": note}
        return self.place

    def where(self) -> dict[str, Any] | None:
        """What `start` returned plus the server's exit status now; None before `start` (a
        control plane that adopts this actor after a restart asks it this)."""
        return None if self.place is None else {**self.place, "exit_code": self.exit_code()}

    def exit_code(self) -> int | None:
        """The server's exit status, None while it runs."""
        return None if self.process is None else self.process.poll()

    def terminate(self, force: bool) -> None:
        """SIGTERM (the server finishes its in-flight work), or SIGKILL when `force`."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL if force else signal.SIGTERM)

    def renice(self, nice: int) -> None:
        """Set the server's CPU priority (boots low, serves at `SERVE_NICE`)."""
        if self.process is not None:
            renice(self.process.pid, nice)
