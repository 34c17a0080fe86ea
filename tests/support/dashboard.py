"""The Grafana dashboard's queries and the metric names each selects: shared by the fast check
against the captured exposition (tests/metrics/test_dashboard.py) and the live one against the
shared instance's /metrics (tests/metrics/test_engine_metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}
DASHBOARD = json.loads((ROOT / "dashboards/podium.json").read_text())
QUERIES = [
    (f"{panel['title']} [{t['refId']}]", t["expr"])
    for panel in DASHBOARD["panels"]
    for t in panel.get("targets", ())
]
"""(panel title [refId], PromQL) of every panel target."""


def sample_names(text: str) -> set[str]:
    """Every sample name of a Prometheus text exposition."""
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression selects (raises on invalid PromQL)."""
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.add(node.name)
            return
        for attr in ("expr", "lhs", "rhs", "param", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None:
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(promql_parser.parse(expr))
    return found
