"""The comparison report: runs alternate A/B/B/A between the peer and Podium, so drift on a
shared machine (another job starting, a CPU clock change) hits both sides alike, and each
ratio is printed with its spread over the repeats (min / median / max), never alone."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from bench.harness.stats import median


class LoadFigures(Protocol):
    """What one load run reports (bench.kserve_load.LoadResult and the like)."""

    @property
    def throughput(self) -> float: ...

    def percentile_ms(self, q: float) -> float: ...


def abba(repeats: int, peer: str = "peer", podium: str = "podium") -> list[tuple[int, str]]:
    """(repeat, side) in A/B/B/A order: repeat 0 runs the peer first, repeat 1 Podium first,
    and so on. Each repeat runs both sides once."""
    order = []
    for i in range(repeats):
        pair = (peer, podium) if i % 2 == 0 else (podium, peer)
        order += [(i, side) for side in pair]
    return order


@dataclass(frozen=True)
class Spread:
    """Values of one figure over the repeats."""

    values: tuple[float, ...]

    @property
    def min(self) -> float:
        return min(self.values) if self.values else math.nan

    @property
    def max(self) -> float:
        return max(self.values) if self.values else math.nan

    @property
    def median(self) -> float:
        return median(self.values)

    def __str__(self) -> str:
        return (f"{self.median:.3f} (min {self.min:.3f}, max {self.max:.3f}, "
                f"n={len(self.values)})")


def ratios(podium: Sequence[float], peer: Sequence[float]) -> Spread:
    """Podium / peer, repeat by repeat."""
    return Spread(tuple(p / r if r else math.nan for p, r in zip(podium, peer, strict=True)))


def ratio_line(label: str, podium: Sequence[float], peer: Sequence[float],
               width: int = 38) -> str:
    """`label`, the medians of each side, and the ratio's median with its min and max."""
    spread = ratios(podium, peer)
    return (f"{label:{width}} {median(podium):10.2f} {median(peer):10.2f}  "
            f"x{spread.median:.3f} [{spread.min:.3f} .. {spread.max:.3f}] n={len(spread.values)}")


def print_ratios(rows: Sequence[tuple[str, Sequence[float], Sequence[float]]],
                 podium: str = "podium", peer: str = "peer", width: int = 38) -> None:
    """A table: one `ratio_line` per (label, podium values, peer values)."""
    print(f"{'metric':{width}} {podium:>10} {peer:>10}  ratio median [min .. max]")
    for label, ours, theirs in rows:
        print(ratio_line(label, ours, theirs, width))


def print_load_cells(results: Mapping[tuple[str, str, int], Sequence[LoadFigures]],
                     protocols: Sequence[str], concurrency: Sequence[int],
                     ours: str, theirs: str, title: str) -> None:
    """The ratio table of a protocol x concurrency load comparison: for each cell, throughput
    and p50/p99 latency of `ours` over `theirs`, repeat by repeat. `results` holds each side's
    runs by (side, protocol, concurrency)."""
    print(f"\n{title} (throughput: higher is better; latency: lower is better)")
    print(f"{'cell':38} {ours:>10} {theirs:>10}  ratio median [min .. max]")
    for protocol in protocols:
        for c in concurrency:
            a, b = results[(ours, protocol, c)], results[(theirs, protocol, c)]
            cell = f"{protocol} c={c}"
            print(ratio_line(f"{cell} throughput req/s", [r.throughput for r in a],
                             [r.throughput for r in b]))
            for q in (50, 99):
                print(ratio_line(f"{cell} p{q} ms", [r.percentile_ms(q) for r in a],
                                 [r.percentile_ms(q) for r in b]))
