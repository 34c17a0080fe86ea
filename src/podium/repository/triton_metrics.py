"""Triton's per-model metrics (`nv_inference_*`), rendered from the repository's statistics
for the `--metrics-port` endpoint, so dashboards and alerts written for Triton read Podium.

Counters per served version, labelled `model` and `version` as Triton labels them:
request success and failure, inferences (batch elements), model executions, and the
cumulative request duration in microseconds. Triton's queue and compute split
(`nv_inference_queue_duration_us`, `nv_inference_compute_*`) is not measured apart, and GPU
and cache metrics have no counterpart: those names are absent, not zero.
"""

from __future__ import annotations

from podium.repository.repository import ModelRepository

FAMILIES: tuple[tuple[str, str], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch "
     "sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached "
     "requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include "
     "cached requests)"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in "
     "microseconds"),
)


def render_triton_metrics(repository: ModelRepository) -> str:
    """The nv_inference_* families in Prometheus text format, one sample per ready version."""
    rows = repository.statistics()
    lines: list[str] = []
    for family, text in FAMILIES:
        lines += [f"# HELP {family} {text}", f"# TYPE {family} counter"]
        for row in rows:
            stats = row["inference_stats"]
            value = {
                "nv_inference_request_success": stats["success"]["count"],
                "nv_inference_request_failure": stats["fail"]["count"],
                "nv_inference_count": row["inference_count"],
                "nv_inference_exec_count": row["execution_count"],
                "nv_inference_request_duration_us":
                    (stats["success"]["ns"] + stats["fail"]["ns"]) // 1000,
            }[family]
            labels = f'model="{_escape(row["name"])}",version="{_escape(row["version"])}"'
            lines.append(f"{family}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


__all__ = ["FAMILIES", "render_triton_metrics"]
