"""docs/metrics.md documents every podium:* metric with its real type and labels."""

from __future__ import annotations

import re
from pathlib import Path

from podium.metrics import pipeline, server

assert pipeline.STEPS  # registered on import, as a served pipeline imports it
DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = re.findall(r"^\| `(podium:[\w:]+)` \| (\w+) \| ([^|]+) \|", DOC.read_text(), re.M)
    return {
        name: (kind, tuple(sorted(x.strip() for x in labels.split(",") if "(none)" not in x)))
        for name, kind, labels in rows
    }


def registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    out = {}
    for family in server.REGISTRY.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        metric = server.REGISTRY._names_to_collectors[name]
        out[name] = (family.type, tuple(sorted(metric._labelnames)))
    return out


def test_every_server_metric_is_in_the_table_with_its_type_and_labels() -> None:
    assert documented() == registered()
