"""Bounded shutdown: once a Podium process is told to stop, it is gone within its timeout.

The graceful path (drain, unload, stop instances) runs on the event loop and in worker
threads, and any of them can hang: a model's `initialize` that never returns keeps its thread,
and Python joins that thread before it exits. So the deadline is kept by a daemon thread that
owes nothing to either: when the time is up it dumps every thread's stack (what hung), kills
the process's whole tree of children (vLLM engine cores, `podium up`'s instances) and ends the
process with `EXIT_TIMED_OUT`, saying so in one log line.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time

import psutil

log = logging.getLogger("podium.shutdown")
EXIT_TIMED_OUT = 124
"""Exit status of a process whose graceful shutdown did not finish in time (as `timeout`)."""
MIN_TIMEOUT_S = 1.0
"""Even `--shutdown-timeout 0` gives an idle process this long to exit cleanly."""


class ShutdownWatchdog:
    """Armed when a stop begins; ends the process at the deadline unless it exited first."""

    def __init__(self, what: str, timeout_s: float) -> None:
        self.what = what
        self.timeout_s = max(MIN_TIMEOUT_S, timeout_s)
        self._lock = threading.Lock()
        self._deadline: float | None = None

    @property
    def armed(self) -> bool:
        """Whether a stop has begun."""
        return self._deadline is not None

    def arm(self) -> None:
        """Start the countdown (the first call only; safe from a signal handler)."""
        with self._lock:
            if self._deadline is not None:
                return
            self._deadline = time.monotonic() + self.timeout_s
        threading.Thread(target=self._expire, name="podium-shutdown-watchdog",
                         daemon=True).start()

    def remaining(self, reserve_s: float = 0.0) -> float:
        """Seconds left before the deadline, less `reserve_s` kept for later steps (>= 0)."""
        if self._deadline is None:
            return max(0.0, self.timeout_s - reserve_s)
        return max(0.0, self._deadline - time.monotonic() - reserve_s)

    def _expire(self) -> None:
        assert self._deadline is not None
        while (left := self._deadline - time.monotonic()) > 0:
            time.sleep(left)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # which step hung
        num_killed = kill_children()
        log.critical("%s: shutdown timed out after %g s; killed %d process%s; exiting %d",
                     self.what, self.timeout_s, num_killed, "" if num_killed == 1 else "es",
                     EXIT_TIMED_OUT)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_TIMED_OUT)


def kill_children() -> int:
    """SIGKILL every descendant of this process (children first found, then theirs)."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    num_killed = 0
    for child in children:
        try:
            child.kill()
            num_killed += 1
        except psutil.NoSuchProcess:
            pass
        except psutil.Error:
            log.warning("could not kill pid %d", child.pid)
    psutil.wait_procs(children, timeout=2)  # reaped, so none lingers as a zombie
    return num_killed
