"""Sub-steps of one boot step, timed where the work happens and recorded by the boot.

The boot sequence (`podium.server.boot`) times its steps; a step such as a vLLM engine's start
is several costs (engine config, engine core and worker up, OpenAI serving objects, warm-up,
admission probe) measured inside the backend, which must not know the server. The boot step
opens a `recording` around its work; the backend marks each part with `substep`. Both sides
meet through a context variable, which asyncio tasks and `asyncio.to_thread` inherit, so a
sub-step timed in a thread or a task beside the step is still recorded to it. Outside a boot
step (a model loaded over the API) a sub-step is only logged.

Every sub-step is logged with its duration as it ends (`boot step NAME: PART took 1.23s`);
parts that ran beside another say so in their name (e.g. "constraint catalog (beside the
rest)"), so their seconds are not meant to add up to the step's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

log = logging.getLogger("podium.boot")


@dataclass(frozen=True)
class SubStep:
    name: str
    seconds: float
    detail: str = ""


Recorder = Callable[[SubStep], None]
_recorder: ContextVar[tuple[str, Recorder] | None] = ContextVar("podium_boot_substeps",
                                                                 default=None)


@contextlib.contextmanager
def recording(step: str, record: Recorder) -> Iterator[None]:
    """Sub-steps marked while this is open (in this context, its tasks and threads) are
    passed to `record` and logged under `step`."""
    token = _recorder.set((step, record))
    try:
        yield
    finally:
        _recorder.reset(token)


def note(name: str, seconds: float, detail: str = "") -> None:
    """Record a sub-step timed by the caller (or elsewhere, e.g. in another process)."""
    current = _recorder.get()
    step = current[0] if current else "load"
    log.info("boot step %s: %s took %.2fs%s", step, name, seconds,
             f" ({detail})" if detail else "")
    if current is not None:
        current[1](SubStep(name, seconds, detail))


@contextlib.contextmanager
def substep(name: str) -> Iterator[list[str]]:
    """Time the block as one sub-step; append to the yielded list to give it a detail."""
    detail: list[str] = []
    started = time.monotonic()
    try:
        yield detail
    finally:
        note(name, time.monotonic() - started, "; ".join(detail))
