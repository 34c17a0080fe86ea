"""On vLLM's CPU platform, the engine core and its worker wait for each other without spinning.

vLLM's engine core hands each step to its worker, and gets the worker's output back, through a
shared-memory ring (`shm_broadcast.MessageQueue`). A reader that finds no message waits on its
`SpinCondition`: within `busy_loop_s` (1 s) of its last read it calls `sched_yield()` and looks
again, in a loop, and only after a second without messages does it block on the writer's zmq
notification. Under load a message comes every step, so both processes spin the whole time
they wait: the engine core while the worker computes a step, the worker while the engine core
schedules the next one and hands the outputs to the server.

On a GPU that costs a host core nobody else needs. On a CPU machine, the cores the spinning
takes are the ones that serve: the worker computes on its bound core, and the engine core, the
server (detokenizing, streaming) and whatever else runs share the rest, or the worker's own
when the scheduler puts them there. Profiled on the 2-core machine of docs/benchmarks.md
(`perf record` of the engine core under load, `vllm serve` and Podium alike): the engine core's
time was its wait loop (`sched_yield`, `clock_gettime`, the interpreter running `check()`).

So on CPU a reader blocks on the notification at once (`busy_loop_s = 0`): the writer already
sends one after every write (`SpinCondition.notify`), and the notify socket keeps the last one
(zmq ``CONFLATE``), so a message written between the reader's look and its poll still wakes it.
A wake-up costs a poll and a socket read, microseconds against a step of tens of
milliseconds. ``PODIUM_ENGINE_BUSY_WAIT=1`` keeps vLLM's spinning.

Applied where Podium's code runs in an engine process: the engine core forked from the
preloader (`podium.preload.process.enter_engine_env`, before vLLM's code; a worker forked from
it inherits the patched class), and, as a `vllm.general_plugins` entry point, every engine
process vLLM starts. It patches only the pinned engine version, on CPU, when `SpinCondition`
still has the attribute it sets.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

log = logging.getLogger("podium.engine_patches")
_MARK = "_podium_cpu_wait"
ATTRIBUTE = "busy_loop_s"


def register() -> None:
    """The `vllm.general_plugins` entry point (and the preloaded engine core's call): readers
    block instead of spinning, where this applies."""
    if not applies():
        return
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    patch(SpinCondition)


def applies() -> bool:
    """The pinned vLLM, on its CPU platform, with `SpinCondition(..., busy_loop_s)`, and not
    turned off (``PODIUM_ENGINE_BUSY_WAIT=1``)."""
    from podium import env

    if env.engine_busy_wait():
        return False
    try:
        import vllm
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
        from vllm.platforms import current_platform
    except Exception:  # another engine build: nothing to patch
        return False
    from podium.engine import ENGINE_VERSION

    return (vllm.__version__.split("+")[0] == ENGINE_VERSION and current_platform.is_cpu()
            and ATTRIBUTE in inspect.signature(SpinCondition.__init__).parameters)


def patch(condition_cls: type) -> None:
    """Make every reader `condition_cls` builds block at once; a second call does nothing."""
    if getattr(condition_cls, _MARK, False):
        return
    condition_cls.__init__ = _blocking(condition_cls.__init__)  # type: ignore[misc]
    setattr(condition_cls, _MARK, True)
    log.debug("patched %s: readers block instead of spinning", condition_cls.__name__)


def _blocking(init: Any) -> Any:
    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if getattr(self, "is_reader", False):
            setattr(self, ATTRIBUTE, 0.0)

    return wrapper
