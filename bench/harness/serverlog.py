"""What a server's request log says of the refusals a bench saw (`podium.metrics.request_log`'s
text lines: `ID METHOD PATH STATUS 1.2ms ...`): their time inside the server, head to answer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.harness.stats import median, percentile

_REFUSAL_LINE = re.compile(r" 429 ([0-9.]+)ms ")
_CALL_LINE = re.compile(r"^(\S+) RPC \S+ \S+ ([0-9.]+)ms ")


def refusals_inside(log: Path, ids: set[str] | None = None) -> dict[str, Any]:
    """The refusals' time inside the server, from its request log (head to answer): its 429
    lines, or (`ids`: gRPC calls seen refused) those calls' lines."""
    lines = log.read_text(errors="replace").splitlines()
    seconds = ([float(m[1]) / 1000 for line in lines if (m := _REFUSAL_LINE.search(line))]
               if ids is None else
               [float(m[2]) / 1000 for line in lines
                if (m := _CALL_LINE.match(line)) and m[1] in ids])
    if not seconds:
        return {"refusals_logged": 0}
    return {"refusals_logged": len(seconds),
            "inside_median_ms": round(median(seconds) * 1000, 2),
            "inside_p95_ms": round(percentile(seconds, 95) * 1000, 2),
            "inside_p99_ms": round(percentile(seconds, 99) * 1000, 2),
            "inside_max_ms": round(max(seconds) * 1000, 2)}
