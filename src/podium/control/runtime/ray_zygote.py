"""A zygote per Ray node: the Ray runtime's instances fork their server from it, as the local
runtime's do from its own (`podium.preload.zygote`), instead of importing vLLM afresh.

- **One per node**: `NodeZygote`, a detached actor named ``podium-zygote@<node id>`` in the
  control plane's namespace, pinned to its node (node affinity, not soft) and asking for no
  CPU. It runs the same zygote process the local runtime runs (`podium.preload.spawn.Zygote`),
  whose socket is on the node's own filesystem, in a folder of its own that it removes when
  the plane stops it, or that the node's next zygote actor removes (`_sweep`). It is made on
  demand (get-or-create by name): early, by the runtime (`ray_zygote_fleet`: on every live
  node once a deployment of vLLM exists, and on each node that joins later), and by an
  `InstanceHost` for its node. Whether the node runs one is the node's own call
  (`control.runtime.zygote_off`: its engine, its ``PODIUM_ZYGOTE``), not the plane's.
- **Waiting for it**: a launch that finds its node's zygote still importing the engine waits
  for it (`fork_on_node`, at most `WAIT_S`): the zygote's import takes as long as the plain
  server's own would, and the instance then skips the rest (its engine preloader is forked
  too). It starts plain when the bound passes or the zygote exits meanwhile.
- **Forking**: the host connects to that socket and asks for its server. The server is the
  zygote's child, not the host actor's: PR_SET_PDEATHSIG cannot tie it to the actor. It keeps
  its gate pipe open instead, armed with O_ASYNC/F_SETSIG (`podium.preload.zygote.watch_gate`):
  when the actor's process dies, its end of the pipe closes and the kernel sends the server
  SIGTERM. Its exit status is the one the zygote records (`ZygoteProcess.poll`).
- **Never a failed boot**: an actor that cannot be made or does not answer within
  `ASK_TIMEOUT_S`, a zygote gone (restarted for the next instance) or still importing after
  `WAIT_S`, a node that runs none, a load-time environment that differs, a fork that fails:
  each starts the instance as a plain process, the reason in its event (a warning in the
  log; an info line where the plane asked for no wait or the node runs no zygote).
  ``PODIUM_ZYGOTE=0`` turns zygotes off for both runtimes.
- **Thread environment**: Ray sets ``OMP_NUM_THREADS`` in each actor's worker when the node's
  environment has none (the actor's CPUs, at least 1). Neither the zygote nor an instance
  takes Ray's value (`without_ray_threads`): the engine sizes and binds its own threads, as
  under the local runtime, and a value the engine's preloader inherited would make its worker
  be spawned instead of forked (`podium.preload.worker.fork_plan`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from podium.preload.environment import LOAD_TIME, engine_env, load_time_drift
from podium.preload.spawn import Zygote, ZygoteProcess, alive, fork_server

log = logging.getLogger("podium.preload")
NAME_PREFIX = "podium-zygote@"
DIR_PREFIX = "podium-ray-zygote-"
"""A node zygote's folder in the node's temporary directory (short: a socket's path is at most
107 bytes), with an ``owner`` file naming its actor's pid."""
ASK_TIMEOUT_S = 10.0
"""How long a host waits for its node's zygote actor to answer: milliseconds once the actor
runs; a second or a few when it is made just now (a worker process starts for it). Longer
means the node is in trouble: plain."""
WAIT_S = 60.0
"""How long a launch waits at most for its node's zygote to finish importing the engine
(8 to 11 s on a 2-CPU node: as long as a plain server's own import). Longer means the zygote is
in trouble: plain."""
POLL_S = 0.2
"""How often a waiting launch asks the zygote again."""
RAY_THREADS = "OMP_NUM_THREADS"


def zygote_name(node_id: str) -> str:
    return f"{NAME_PREFIX}{node_id}"


def without_ray_threads(environ: Mapping[str, str],
                        initial: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` without the ``OMP_NUM_THREADS`` Ray's worker put there: one absent from the
    process's initial environment (`initial`, else ``/proc/self/environ``, which holds what
    the process was started with, not later changes). An operator's value (in the node's
    environment, or a runtime_env's) is kept."""
    env = dict(environ)
    if RAY_THREADS in env and RAY_THREADS not in (
            _initial_environ() if initial is None else initial):
        del env[RAY_THREADS]
    return env


def _initial_environ() -> dict[str, str]:
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:  # no /proc: keep what is there
        return dict(os.environ)
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


class NodeZygote:
    """The zygote of one Ray node (made a detached actor by `node_zygote`). With `modules`
    None it preloads the engine, and only where the node runs one (`zygote_off`)."""

    def __init__(self, workdir: str, modules: list[str] | None, nice: int) -> None:
        import ray

        from podium.control.runtime import zygote_off

        node = ray.get_runtime_context().get_node_id()
        _sweep(Path(tempfile.gettempdir()))  # folders of gone zygote actors on this machine
        self.off = zygote_off() if modules is None else None
        """Why this node runs no zygote (none is started), or None."""
        self.dir = tempfile.mkdtemp(prefix=DIR_PREFIX)
        Path(self.dir, "owner").write_text(str(os.getpid()))
        self.zygote = Zygote(Path(workdir), modules=modules,
                             base_env=without_ray_threads(os.environ), nice=nice)
        self.zygote.socket = os.path.join(self.dir, "zygote.sock")
        self.zygote.log_path = Path(workdir) / "logs" / f"zygote-{node[:12]}.log"
        self.began = time.monotonic()
        if self.off is None:
            self.zygote.start()

    def status(self) -> dict[str, Any]:
        """Where it stands, as ``state`` (and ``starts``, the zygote processes started so far):
        "ready" (with its ``socket``, ``pid`` and ``load_time`` environment: fork from it),
        "importing" (for ``for_s`` seconds), "exited" (with its ``pid`` and ``exit_code``; a
        new one is started now), or "off" (``why`` this node runs none)."""
        zygote = self.zygote
        if self.off is not None:
            return {"state": "off", "why": self.off, "starts": 0}
        process = zygote.process
        if process is None or not zygote.alive():
            if process is not None:
                log.warning("zygote (pid %d) exited (%s): restarting it", process.pid,
                            process.returncode)
            self._start()
            return {"state": "exited", "pid": process and process.pid,
                    "exit_code": process and process.returncode, "starts": zygote.starts - 1}
        if not zygote.ready():
            return {"state": "importing", "for_s": round(time.monotonic() - self.began, 1),
                    "starts": zygote.starts}
        return {"state": "ready", "socket": zygote.socket, "pid": process.pid,
                "load_time": _load_time(zygote.env), "starts": zygote.starts}

    def target(self) -> dict[str, Any] | None:
        """What `status` says once it is ready; None otherwise."""
        found = self.status()
        return found if found["state"] == "ready" else None

    def restart(self) -> None:
        """Start a new zygote (the last one did not fork an instance it was asked for)."""
        self.zygote.stop()
        self._start()

    def stop(self) -> None:
        """Stop the zygote and remove its folder (the plane closes; the actor is killed next)."""
        self.zygote.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _start(self) -> None:
        self.began = time.monotonic()
        self.zygote.start()


def _sweep(tmp: Path) -> None:
    """Remove the folders of node zygotes whose actor is gone (killed, or its worker died:
    nothing of theirs ran to remove them). Best effort."""
    for folder in tmp.glob(f"{DIR_PREFIX}*"):
        with contextlib.suppress(OSError, ValueError):
            if not alive(int((folder / "owner").read_text())):
                shutil.rmtree(folder, ignore_errors=True)


def node_zygote(ray: Any, node_id: str, *, namespace: str, workdir: str,
                modules: list[str] | None = None, nice: int = 0) -> Any:
    """The zygote actor of `node_id` in the control plane's `namespace` (an actor's runtime
    context names its job's, not the plane's), made now if it does not exist (returns at
    once)."""
    strategies = ray.util.scheduling_strategies
    return ray.remote(NodeZygote).options(
        name=zygote_name(node_id), namespace=namespace, lifetime="detached",
        get_if_exists=True, num_cpus=0, max_restarts=0,
        scheduling_strategy=strategies.NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(workdir, modules, nice)


def fork_on_node(argv: list[str], *, out: IO[bytes], env: Mapping[str, str], nice: int,
                 settings: Mapping[str, Any]) -> tuple[ZygoteProcess | None, str]:
    """In an `InstanceHost`: ``python ARGV`` forked from this node's zygote, its gate open and
    watched (it dies with this process), and a note saying so; or None and why not (the caller
    starts a plain process). `settings` are `node_zygote`'s, and ``wait_s``: how long to wait
    for a zygote still importing (`WAIT_S` when absent)."""
    import ray

    settings = dict(settings)
    wait_s = float(settings.pop("wait_s", WAIT_S))
    began = time.monotonic()
    try:
        actor = node_zygote(ray, ray.get_runtime_context().get_node_id(), **settings)
        found = first = ray.get(actor.status.remote(), timeout=ASK_TIMEOUT_S)
        while (found["state"] == "importing" and found["starts"] == first["starts"]
               and time.monotonic() - began < wait_s):
            time.sleep(POLL_S)
            found = ray.get(actor.status.remote(), timeout=ASK_TIMEOUT_S)
    except Exception as exc:  # an optimisation: any failure starts it plain
        last = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else repr(exc)
        return _plain(f"the node's zygote did not answer ({type(exc).__name__}: {last})")
    waited = time.monotonic() - began
    if found["state"] == "off":
        return _plain(f"the node runs no zygote: {found['why']}", logging.INFO)
    if found["state"] == "exited" or (found["state"] == "importing"
                                      and found["starts"] != first["starts"]):
        how = (f"exited ({found['exit_code']})" if found["state"] == "exited"
               else "exited and was restarted")
        during = " while this instance waited for its import" if found is not first else ""
        return _plain(f"the node's zygote {how}{during}; it is restarted for the next "
                      "instances")
    if found["state"] == "importing":
        if wait_s <= 0:
            return _plain("the node's zygote is starting (importing the engine)", logging.INFO)
        return _plain(f"the node's zygote was still importing the engine after {waited:.0f} s "
                      f"(the bound: {wait_s:g} s)")
    drift = load_time_drift(found["load_time"], _load_time(engine_env(env)))
    if drift:
        return _plain(f"its {', '.join(drift)} differ(s) from the node's zygote's and are read "
                      "when a library loads")
    process: ZygoteProcess | None = None
    try:
        process = fork_server(found["socket"], argv, out=out, env=env, nice=nice, watch=True)
        process.stdin.write(b"go\n")  # the pipe stays open: the server's death watch
    except (OSError, EOFError, ValueError) as exc:
        if process is not None:
            process.stdin.close()  # never started: it exits at its gate
        actor.restart.remote()
        return _plain(f"the node's zygote (pid {found['pid']}) did not fork it ({exc!r}); "
                      "restarting the zygote")
    note = f"forked from the node's zygote (pid {found['pid']})"
    if found is not first:
        note += f", after waiting {waited:.1f} s for its import"
    log.info("instance %s", note)
    return process, note


def _plain(why: str, level: int = logging.WARNING) -> tuple[None, str]:
    log.log(level, "zygote bypassed: %s; the instance starts as a plain process", why)
    return None, f"started as a plain process: {why}"


def _load_time(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME)}
