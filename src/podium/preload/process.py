"""The engine core's process when it is forked from the preloader (a fork server).

`PreloadedContext` is what vLLM's engine-core launcher gets instead of its `spawn` context
(`podium.preload.server.engine_context`): its `Process` is started by the preloader when
that is alive and its load-time environment matches the engine's, else spawned as usual with a
warning. In the forked child, `enter_engine_env` replaces the preloader's environment with the
server's at the engine's start before vLLM's code runs."""

from __future__ import annotations

import functools
import io
import logging
import os
import select
from collections.abc import Callable
from multiprocessing import context, forkserver, popen_forkserver, popen_spawn_posix, spawn, util
from typing import Any

log = logging.getLogger("podium.preload")
WORKER_METHOD = "spawn"
"""The start method vLLM is told for the engine core's worker (what it does on CPU); the
worker is then forked from the engine core instead when its OpenMP binding allows it
(`podium.preload.worker`)."""
STATUS_WAIT_S = 2.0
"""How long to wait for the fork server's exit status once the engine core's pidfd says it
has exited (it reports from its SIGCHLD handler)."""


def enter_engine_env(env: dict[str, str], target: Callable[..., Any], *args: Any,
                     **kwargs: Any) -> Any:
    """Run in the forked engine core: take the server's environment, then run vLLM's target."""
    os.environ.clear()
    os.environ.update(env)
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = WORKER_METHOD
    from podium.preload import waits, worker

    worker.install(env)
    waits.install(env)
    return target(*args, **kwargs)


class _PidfdPopen(popen_forkserver.Popen):
    """A fork-server start whose sentinel is the child's pidfd: the engine core's exit is seen
    whether or not the fork server (which reports it otherwise) is still alive."""

    def __init__(self, process_obj: Any, server: forkserver.ForkServer) -> None:
        self._server = server
        super().__init__(process_obj)

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            context.reduction.dump(prep_data, buf)
            context.reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self._status, w = self._server.connect_to_new_process(self._fds)
        parent_w = os.dup(w)  # the child's sentinel of this process, as in the stdlib
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self._status)
        self.sentinel = self._open_sentinel()
        self.finalizer = util.Finalize(self, util.close_fds,
                                       (parent_w, self._status, self.sentinel))

    def _open_sentinel(self) -> int:
        """The child's pidfd; or, when the child has already exited and the fork server has
        reaped it (a short-lived child, a parent slow to get here), a copy of the status pipe,
        where the fork server writes its exit status: readable once that is there, as a pidfd is
        once the child exits. (Taking a vanished pid for a failed start bypassed the preloader
        and started the process a second time.)"""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return os.dup(self._status)
        if select.select([self._status], [], [], 0)[0]:  # reaped before the pidfd was opened:
            os.close(pidfd)  # the pid may be another process's by now
            return os.dup(self._status)
        return pidfd

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is None:
            timeout = 0 if flag == os.WNOHANG else None
            ready, _, _ = select.select([self.sentinel], [], [], timeout)
            if not ready:
                return None
            self.returncode = self._exit_status()
        return self.returncode

    def _exit_status(self) -> int:
        ready, _, _ = select.select([self._status], [], [], STATUS_WAIT_S)
        if ready:
            try:
                return forkserver.read_signed(self._status)
            except (OSError, EOFError):
                pass
        return 255  # the fork server is gone: the child's status went with it


class PreloadedProcess(context.SpawnProcess):
    """vLLM's engine core process: forked from the preloader when it can be, else spawned."""

    _start_method = "spawn"

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        from podium.preload import server

        preloader = server.usable(dict(os.environ))
        if preloader is not None:
            target = process_obj._target
            process_obj._target = functools.partial(enter_engine_env, dict(os.environ), target)
            try:
                return _PidfdPopen(process_obj, preloader)
            except (OSError, EOFError) as exc:
                process_obj._target = target
                server.bypass(f"it could not start the engine core ({exc!r})")
        return popen_spawn_posix.Popen(process_obj)


class PreloadedContext(context.SpawnContext):
    """A spawn context whose processes start from the preloader (`PreloadedProcess`)."""

    Process = PreloadedProcess
