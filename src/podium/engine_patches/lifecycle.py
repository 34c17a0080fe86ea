"""The engine core a Podium server starts lives and stops with that server, not its terminal.

vLLM's engine core is a child process of whatever built the engine. Unpatched, it shares that
process's process group and does not watch it:

- **A signal to the whole group** reaches the engine core and its worker as well as the
  server: Ctrl-C in a terminal, ``timeout``, ``kill -- -PGID``. The worker exits at once and
  the engine core dies mid-step, so the server's drain answers its in-flight requests 503
  (vLLM's ``EngineDeadError``) instead of letting them finish. Measured: a 200-token request
  in flight when ``timeout`` sent SIGTERM to the group failed after 4.8 s.
- **A server killed outright** (SIGKILL, the OOM killer, a supervisor's group kill) leaves its
  engine core running for good with its KV cache: 765 MB resident here, 90 s after the kill
  and still going; a GPU's memory on an accelerator.

So in an engine core started by a Podium server (``PARENT_ENV`` names the server's pid, set
by :func:`podium.backends.vllm.engine._start_engine`), this plugin, run by vLLM before the engine
core starts its worker:

1. moves the process to a process group of its own, which the worker inherits. Only the
   server stops it then, after its drain, through vLLM's own shutdown. SIGTTOU is ignored, so
   a terminal set to ``stty tostop`` does not stop the engine's log writes from the
   background group.
2. watches the server (a pidfd, so no polling). When the server is gone, the engine core gets
   the SIGTERM the server would have sent: vLLM's shutdown aborts what runs and stops the
   worker. If that has not ended the process within ``ORPHAN_GRACE_S``, it gets SIGKILL (the
   worker follows its parent through vLLM's death pipe).

Any other process that loads the plugin (the server itself, the worker, a plain ``vllm
serve`` on a host with Podium installed) is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time

log = logging.getLogger("podium.engine_patches")
PARENT_ENV = "PODIUM_ENGINE_PARENT"
"""The pid of the server that starts an engine; its engine core's parent."""
ORPHAN_GRACE_S = 10.0
"""How long an orphaned engine core's own shutdown may take before it is killed."""
_started = False


def register() -> None:
    """The `vllm.general_plugins` entry point: bind this engine core to its server."""
    global _started
    server = _server_pid()
    if server is None or _started:
        return
    _started = True
    with contextlib.suppress(OSError):  # already a group leader: nothing to leave
        os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    threading.Thread(target=_follow, args=(server,), name="podium-follow-server",
                     daemon=True).start()


def _server_pid() -> int | None:
    """The server's pid when this process is the engine core it started, else None."""
    try:
        server = int(os.environ.get(PARENT_ENV, ""))
    except ValueError:
        return None
    parent = os.getppid()
    # an engine core forked from the server's preloader (podium.preload) has that as parent
    preloader = os.environ.get("PODIUM_ENGINE_PRELOADER")
    if server == os.getpid() or (server != parent and preloader != str(parent)):
        return None  # the server itself, or a worker (its parent is the engine core)
    return server


def _follow(server: int) -> None:
    """Wait for the server to be gone, then stop this process (see the module's doc)."""
    _wait_gone(server)
    log.warning("the Podium server (pid %d) that started this engine core is gone: stopping "
                "the engine", server)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)
    log.warning("the engine core did not stop within %.0f s of its server; killing it",
                ORPHAN_GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_gone(server: int) -> None:
    try:
        fd = os.pidfd_open(server)
    except (AttributeError, OSError):  # no pidfds (an old kernel): ask once a second
        while _server_there(server):
            time.sleep(1.0)
        return
    try:
        if not _server_there(server):
            return  # it went before the pidfd was open (and the pid may be reused)
        select.select([fd], [], [])  # readable once the process has exited
    finally:
        os.close(fd)


def _server_there(server: int) -> bool:
    """The server still runs: it is this process's parent, or (an engine core forked from the
    server's preloader, whose parent is the preloader) the pid still exists."""
    if os.getppid() == server:
        return True
    if os.environ.get("PODIUM_ENGINE_PRELOADER") is None:
        return False
    try:
        os.kill(server, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
