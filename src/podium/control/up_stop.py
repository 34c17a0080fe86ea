"""Stopping `podium up` within `--shutdown-timeout`: the stop signals arm the watchdog, then
the gateways drain, the control loop stops, and the instances are stopped, each step with its
share of what the watchdog has left."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

from podium.control.loop import ControlLoop
from podium.control.plane import ControlPlane
from podium.control.runtime import Runtime
from podium.shutdown import ShutdownWatchdog

if TYPE_CHECKING:
    from podium.control.up_region import RegionServed

log = logging.getLogger("podium.control")
STOP_RESERVE_S = 1.0
"""Of the shutdown timeout, kept for closing the store and the locks after the instances."""


def stop_self() -> None:
    """Stop `podium up` the way SIGTERM does (from any thread)."""
    os.kill(os.getpid(), signal.SIGTERM)


def on_stop_signal(watchdog: ShutdownWatchdog) -> None:
    """SIGTERM / SIGINT start the countdown (and `_serve` stops if it has not begun)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: watchdog.arm())


def stop_gateways(served: list[RegionServed], watchdog: ShutdownWatchdog) -> None:
    for part in served:
        part.gateways.terminate()  # every region's drain at once, on their own clocks
    for part in served:
        # the instances are still up: in-flight requests finish before they are stopped
        part.gateways.stop(timeout_s=watchdog.remaining(reserve_s=watchdog.timeout_s / 2))
        part.feed.forget_gateways()  # gone: nothing more is in flight through them


def stop_loop(loop: ControlLoop, thread: threading.Thread, watchdog: ShutdownWatchdog) -> None:
    loop.stop()
    thread.join(timeout=watchdog.remaining(reserve_s=watchdog.timeout_s / 2))


def stop_instances(plane: ControlPlane, runtimes: list[Runtime],
                    watchdog: ShutdownWatchdog) -> None:
    # a loop pass stuck past its share must not keep the instances running
    locked = plane.lock.acquire(timeout=watchdog.remaining(reserve_s=watchdog.timeout_s / 2))
    if not locked:
        log.warning("a control-loop pass still runs; stopping the instances anyway")
    try:
        for runtime in runtimes:
            runtime.close(timeout_s=watchdog.remaining(reserve_s=STOP_RESERVE_S))
    finally:
        if locked:
            plane.lock.release()
