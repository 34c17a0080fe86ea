"""How late the server's event loop runs what is due: `podium:event_loop_lag_seconds`.

Every request's await (its compiled constraint, the engine's next output, a socket write)
resumes only when the loop gets to it, after the callbacks queued ahead of it: on a loaded
server, the other streams' outputs. That delay is part of every wait a request reports, and no
compiler or engine can make it shorter. The probe sleeps `PERIOD_S` at a time and records how
much later than asked it woke, so an operator (or a benchmark) can tell the loop's share of a
wait from the thing waited for. It costs one timer a tenth of a second.
"""

from __future__ import annotations

import asyncio
import time

PERIOD_S = 0.1
"""Time between two probes."""


async def probe_loop_lag(period_s: float = PERIOD_S) -> None:
    """Record the loop's lag every `period_s` until cancelled."""
    from podium.metrics.server import observe_event_loop_lag

    while True:
        asked = time.perf_counter() + period_s
        await asyncio.sleep(period_s)
        observe_event_loop_lag(max(0.0, time.perf_counter() - asked))
