"""The zygote: a process with vLLM (and Podium's server) imported, from which `podium up`'s local
runtime forks each instance's server, so no instance pays the server's own import of vLLM
(12-17 s of the boot on a 2-core machine). Run as
``python -m podium.preload.zygote SOCKET [MODULE,...]``; the client is `podium.preload.spawn`.

It imports, then listens on SOCKET (its appearance says it is ready) and answers two requests,
each one JSON line with file descriptors beside it (SCM_RIGHTS):

- ``serve`` (fds: the gate's read end, the log file): fork a child that waits at the gate
  like `control.runtime.detached`'s (no "go": it exits unstarted), takes the instance's
  environment, working directory and niceness, then runs ``python ARGV...`` in-process
  (``-m MODULE`` or a script path). The answer is its pid. With ``"watch": true`` (a Ray
  host's instance, `control.runtime.ray_zygote`) the child keeps the gate open past "go" as a
  death watch: the kernel sends it SIGTERM when the gate's last writer closes (`watch_gate`),
  which is how it dies with the host actor that forked it (not its parent: PR_SET_PDEATHSIG
  cannot say that).
- ``preloader`` (fds: a listening socket, the alive pipe's read end, stdout): fork a child
  that is the instance's engine preloader, a `multiprocessing` fork server
  (`podium.preload.server`), with everything already imported.

Nothing of the zygote's state leaks into an instance:

- **exit status**: the zygote reaps its children and writes each one's exit status to
  ``SOCKET.exits/PID`` (`ZygoteProcess.poll` reads it: a supervisor tells a crash from a
  clean exit as for a process it started itself).
- **threads**: the zygote only imports; importing vLLM leaves native threads but no Python
  thread and no OpenMP pool (no parallel region ran), and a fork copies only the forking
  thread. It forks from its one loop, before it ever starts a thread.
- **environment and settings**: the child's environment is replaced by the instance's before
  anything of it runs; Podium reads its settings from the environment when used, never at
  import. Variables read when a library loads (`podium.preload.environment.LOAD_TIME`) cannot
  be replaced after the fact: the zygote starts with the values vLLM's CPU platform sets for
  an engine core, and the runtime forks only instances whose values match (the others are
  started as a plain process, with a warning).
- **metrics**: prometheus_client (imported by vLLM) picks its value class when imported; the
  zygote imports it multiprocess-mode (a scratch directory). The child keeps that one class:
  it notices the change of pid at its first value written or made, and moves every value to
  ``<kind>_<pid>.db`` files in the directory set then (the instance's, by
  `podium.metrics.multiproc`). A second class made in the child (as once here) maps the same
  files a second time, each map with its own idea of where the file ends: each appends over
  the other's entries and writes its values into the middle of the other's keys (the
  instance's /metrics then fails decoding the file; tests/preload/test_zygote.py).

It exits when its stdin (a pipe from the control plane) closes: a plane that crashes takes its
zygote with it, the instances (in sessions of their own) keep serving.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from podium import heap

MODULES = (
    "vllm.v1.engine.async_llm",
    "vllm.engine.arg_utils",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.launchers.api_server.app_state",
    "vllm.entrypoints.openai.chat_completion.protocol",
    "vllm.entrypoints.openai.completion.protocol",
    "vllm.entrypoints.pooling.embed.protocol",
    "vllm.entrypoints.serve.engine.protocol",
    "podium.preload.warm",
    "podium.backends.vllm.engine",
    "podium.server.app",
    "podium.server.serve",
    "uvicorn",
)
"""What a vLLM instance's server imports on its boot path (the engine check's surfaces, the
engine core's and worker's modules for the preloader, Podium's server)."""
PRELOADER_TITLE = "podium engine preloader of server {server}"
"""The process title of an instance's preloader forked from the zygote (its engine core is its
child; tools find an instance's engine by it, `tests/support/llm_load.py`)."""
MAX_REQUEST = 1 << 20
REAP_S = 0.2
"""How often the zygote reaps its exited children (recording their exit status)."""
forked = False
"""True in a process forked from a zygote (an instance's server)."""
socket_path: str | None = None
"""In a forked server: its zygote's socket (it asks it for its engine preloader)."""
origin_env: dict[str, str] = {}
"""In a forked server: the environment the zygote started with (its preloader has it)."""


def main(argv: list[str]) -> int:
    global socket_path, origin_env
    path = argv[0]
    modules = argv[1].split(",") if len(argv) > 1 and argv[1] else MODULES
    scratch = Path(f"{path}.metrics")  # beside the socket: its runtime's folder, not /tmp
    shutil.rmtree(scratch, ignore_errors=True)  # a killed zygote's, never another's
    scratch.mkdir(parents=True)
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(scratch))
    for name in modules:
        with contextlib.suppress(Exception):  # a preload is an optimisation, never a failure
            importlib.import_module(name)
    with contextlib.suppress(ImportError):  # set up here: in a forked child it cannot be
        import setproctitle

        setproctitle.getproctitle()
    heap.freeze()  # the import's heap: no child's collection walks it again (see warm.py)
    socket_path, origin_env = path, dict(os.environ)
    exits = Path(f"{path}.exits")
    exits.mkdir(exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    with socket.socket(socket.AF_UNIX) as listener, selectors.DefaultSelector() as selector:
        staged = f"{path}.{os.getpid()}"
        listener.bind(staged)
        os.chmod(staged, 0o600)
        listener.listen(16)
        os.replace(staged, path)  # appears once bound: connecting to it means ready
        selector.register(listener, selectors.EVENT_READ)
        selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
        try:
            while True:
                _reap(exits)
                for key, _ in selector.select(REAP_S):
                    if key.fileobj != listener:
                        return 0  # the control plane is gone (or closed our stdin)
                    conn, _ = listener.accept()
                    with conn:
                        _answer(conn, listener)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            shutil.rmtree(scratch, ignore_errors=True)
            _reap(exits)


def _reap(exits: Path) -> None:
    """Each exited child's status written to `exits/PID` before it is reaped (`waitid` with
    WNOWAIT: its pid stays taken until the file is there), for the runtime to read."""
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None or found.si_pid == 0:
            return
        code = found.si_status if found.si_code == os.CLD_EXITED else -found.si_status
        staged = exits / f".{found.si_pid}"
        staged.write_text(str(code))
        staged.replace(exits / str(found.si_pid))
        with contextlib.suppress(ChildProcessError):
            os.waitpid(found.si_pid, 0)


def _answer(conn: socket.socket, listener: socket.socket) -> None:
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 4)
        while not data.endswith(b"\n"):
            more = conn.recv(MAX_REQUEST)
            if not more:
                raise EOFError("request cut short")
            data += more
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                conn.close()
                code = _child(request, fds)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                if request.get("kind") == "serve":  # a program's exit: its atexit handlers
                    with contextlib.suppress(BaseException):
                        atexit._run_exitfuncs()
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        reply: dict[str, Any] = {"pid": pid}
    except Exception as exc:
        reply = {"error": repr(exc)}
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(reply).encode() + b"\n")


def _child(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: become what the request asks for (returns its exit code)."""
    global forked
    forked = True
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own children are its to wait for
    if request["kind"] == "preloader":
        _title([PRELOADER_TITLE.format(server=request.get("server", "?"))])
        return _preloader(*fds)
    gate, log = fds
    os.setsid()  # its own session, as `spawn_gated` starts one: outlives the control plane
    os.dup2(log, 1)
    os.dup2(log, 2)
    if not _gate_opened(gate, keep=bool(request.get("watch"))):
        return 0  # the control plane died before it recorded this pid: never start
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request.get("cwd") or os.getcwd())
    if request.get("nice"):
        os.setpriority(os.PRIO_PROCESS, 0, int(request["nice"]))
    _title([sys.executable, *request["argv"]])
    return _run(list(request["argv"]))


def _gate_opened(gate: int, *, keep: bool = False) -> bool:
    line = b""
    while not line.endswith(b"\n") and len(line) < 8:
        chunk = os.read(gate, 8 - len(line))
        if not chunk:
            break
        line += chunk
    if line != b"go\n" or not keep:
        os.close(gate)
        return line == b"go\n"
    watch_gate(gate)
    return True


def watch_gate(gate: int, sig: int = signal.SIGTERM) -> None:
    """Have the kernel send this process `sig` once the gate pipe's last writer closes (its
    holder died): O_ASYNC with F_SETSIG, so no thread watches. The pipe stays open (not
    inherited by the programs it execs) for the life of the process. A writer already gone
    when the watch is armed (no signal for that) is seen by a poll right after: `sig` then."""
    import fcntl
    import select

    fcntl.fcntl(gate, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    fcntl.fcntl(gate, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(gate, fcntl.F_SETSIG, sig)
    fcntl.fcntl(gate, fcntl.F_SETFL, fcntl.fcntl(gate, fcntl.F_GETFL) | os.O_ASYNC)
    poller = select.poll()
    poller.register(gate, select.POLLIN | select.POLLHUP)
    if poller.poll(0):  # readable now: its writer is gone (nothing else is ever written)
        os.kill(os.getpid(), sig)



def _title(command: list[str]) -> None:
    """Its command line as its title (`/proc/PID/cmdline`): the runtime recognises an instance
    it adopts by its port there (`control.runtime.local`), and operators by its command."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join(command))


def _run(argv: list[str]) -> int:
    """``python ARGV`` in this process: ``-m MODULE ARGS`` or ``SCRIPT ARGS``."""
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def _preloader(listener: int, alive: int, out: int) -> int:
    """The instance's engine preloader: a fork server, everything already imported."""
    from multiprocessing import forkserver

    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    forkserver.main(listener, alive, [])
    return 0


if __name__ == "__main__":
    from podium.preload import zygote  # the module others import: its globals are the ones

    sys.exit(zygote.main(sys.argv[1:]))
