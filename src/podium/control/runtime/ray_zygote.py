"""A zygote per Ray node: the Ray runtime's instances fork their server from it, as the local
runtime's do from its own (`podium.preload.zygote`), instead of importing vLLM afresh.

- **One per node**: `NodeZygote`, a detached actor named ``podium-zygote@<node id>`` in the
  control plane's namespace, pinned to its node (node affinity, not soft) and asking for no
  CPU. It runs the same zygote process the local runtime runs (`podium.preload.spawn.Zygote`),
  whose socket is on the node's own filesystem. It is made on demand (get-or-create by name)
  by the runtime, on every live node once a zygote-backed instance is first launched
  (`start_zygotes`), and by an `InstanceHost` for its node: only an instance that finds its
  node's zygote ready forks from it, so the first one on a node usually starts plain while
  the zygote imports beside it.
- **Forking**: the host connects to that socket and asks for its server (`fork_on_node`). The
  server is the zygote's child, not the host actor's: PR_SET_PDEATHSIG cannot tie it to the
  actor. It keeps its gate pipe open instead, armed with O_ASYNC/F_SETSIG
  (`podium.preload.zygote.watch_gate`): when the actor's process dies, its end of the pipe
  closes and the kernel sends the server SIGTERM. Its exit status is the one the zygote
  records (`ZygoteProcess.poll`).
- **Never a failed boot**: an actor that cannot be made or does not answer within
  `ASK_TIMEOUT_S`, a zygote still importing or gone (restarted for the next instance), a
  load-time environment that differs, a fork that fails: each starts the instance as a plain
  process (with a warning, an info line for a zygote still starting). ``PODIUM_ZYGOTE=0``
  turns zygotes off for both runtimes.
- **Thread environment**: Ray sets ``OMP_NUM_THREADS`` in each actor's worker when the node's
  environment has none (the actor's CPUs, at least 1). Neither the zygote nor an instance
  takes Ray's value (`without_ray_threads`): the engine sizes and binds its own threads, as
  under the local runtime, and a value the engine's preloader inherited would make its worker
  be spawned instead of forked (`podium.preload.worker.fork_plan`).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from podium.preload.environment import LOAD_TIME, engine_env, load_time_drift
from podium.preload.spawn import Zygote, ZygoteProcess, fork_server

log = logging.getLogger("podium.preload")
NAME_PREFIX = "podium-zygote@"
ASK_TIMEOUT_S = 10.0
"""How long a host waits for its node's zygote actor to say where it listens: milliseconds once
the actor runs; a second or a few when it is made just now (a worker process starts for it, and
it answers "importing": the instance starts plain). Longer means the node is in trouble: plain."""
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
    """The zygote of one Ray node (made a detached actor by `node_zygote`)."""

    def __init__(self, workdir: str, modules: list[str] | None, nice: int) -> None:
        import ray

        node = ray.get_runtime_context().get_node_id()
        self.dir = tempfile.mkdtemp(prefix="podium-zygote-")  # short: a socket's path is
        self.zygote = Zygote(Path(workdir), modules=modules,  # at most 107 bytes
                             base_env=without_ray_threads(os.environ), nice=nice)
        self.zygote.socket = os.path.join(self.dir, "zygote.sock")
        self.zygote.log_path = Path(workdir) / "logs" / f"zygote-{node[:12]}.log"
        self.zygote.start()

    def target(self) -> dict[str, Any] | None:
        """Where to fork from (its socket, pid and load-time environment) once it is ready;
        None while it imports, or when it was gone (it is restarted now)."""
        zygote = self.zygote
        if not zygote.alive():
            if zygote.process is not None:
                log.warning("zygote (pid %d) exited (%s): restarting it",
                            zygote.process.pid, zygote.process.returncode)
            zygote.start()
            return None
        if not zygote.ready():
            return None
        return {"socket": zygote.socket, "pid": zygote.process.pid,  # type: ignore[union-attr]
                "load_time": _load_time(zygote.env)}

    def restart(self) -> None:
        """Start a new zygote (the last one did not fork an instance it was asked for)."""
        self.zygote.stop()
        self.zygote.start()


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


def start_zygotes(ray: Any, **settings: Any) -> list[str]:
    """A zygote on every live node (made where missing); the node ids."""
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    for node in nodes:
        node_zygote(ray, node, **settings)
    return nodes


def fork_on_node(argv: list[str], *, out: IO[bytes], env: Mapping[str, str], nice: int,
                 settings: Mapping[str, Any]) -> tuple[ZygoteProcess | None, str]:
    """In an `InstanceHost`: ``python ARGV`` forked from this node's zygote, its gate open and
    watched (it dies with this process), and a note saying so; or None and why not (the caller
    starts a plain process)."""
    import ray

    try:
        actor = node_zygote(ray, ray.get_runtime_context().get_node_id(), **settings)
        target = ray.get(actor.target.remote(), timeout=ASK_TIMEOUT_S)
    except Exception as exc:  # an optimisation: any failure starts it plain
        last = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else repr(exc)
        return _plain(f"the node's zygote did not answer ({type(exc).__name__}: {last})")
    if target is None:
        return _plain("the node's zygote is starting (importing the engine)", logging.INFO)
    drift = load_time_drift(target["load_time"], _load_time(engine_env(env)))
    if drift:
        return _plain(f"its {', '.join(drift)} differ(s) from the node's zygote's and are read "
                      "when a library loads")
    process: ZygoteProcess | None = None
    try:
        process = fork_server(target["socket"], argv, out=out, env=env, nice=nice, watch=True)
        process.stdin.write(b"go\n")  # the pipe stays open: the server's death watch
    except (OSError, EOFError, ValueError) as exc:
        if process is not None:
            process.stdin.close()  # never started: it exits at its gate
        actor.restart.remote()
        return _plain(f"the node's zygote (pid {target['pid']}) did not fork it ({exc!r}); "
                      "restarting the zygote")
    note = f"forked from the node's zygote (pid {target['pid']})"
    log.info("instance %s", note)
    return process, note


def _plain(why: str, level: int = logging.WARNING) -> tuple[None, str]:
    log.log(level, "zygote bypassed: %s; the instance starts as a plain process", why)
    return None, f"started as a plain process: {why}"


def _load_time(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(LOAD_TIME)}
