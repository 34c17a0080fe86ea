"""The one bench harness: every script in `bench/` starts its servers, drives its load and
reports its figures through these helpers, so a figure's method is written once.

- `procs`: `serve` (start a process, wait for readiness with a bound,
  stop it cleanly, kill its whole tree if it will not stop or never became ready), CPU time.
- `loops`: closed-loop and open-loop asyncio load, bounded in count and time, loopback only.
- `rawload`: the multi-process raw-socket generator for loads httpx cannot offer on 2 cores.
- `stats`: percentiles (one definition: linear interpolation, numpy's default).
- `proccpu`: each process's CPU, wait for a core and preemptions, each core's busy share, per
  phase (from /proc).
- `report`: the A/B/B/A order between a peer and Podium, and each ratio with its spread.
- `free_port` is the product's own (`podium.ports`), the one definition.
"""

from bench.harness.loops import Sample, check_loopback, closed_loop, loopback_client, open_loop
from bench.harness.procs import (
    ROOT,
    Served,
    cpu_seconds,
    module_command,
    serve,
    wait_until,
)
from bench.harness.report import Spread, abba, print_load_cells, print_ratios, ratio_line
from bench.harness.stats import median, percentile, percentiles
from podium.ports import free_port  # the one definition, shared with the product and tests

__all__ = [
    "ROOT", "Sample", "Served", "Spread", "abba", "check_loopback", "closed_loop",
    "cpu_seconds", "free_port", "loopback_client", "median", "module_command", "open_loop",
    "percentile", "percentiles", "print_load_cells", "print_ratios", "ratio_line", "serve",
    "wait_until",
]
