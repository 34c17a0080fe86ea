"""Generate dashboards/podium.json, the Grafana dashboard for Podium instances.

Run `python dashboards/build.py` after editing; a test checks the JSON is current and that
every metric its queries name is one an instance exposes.

vLLM labels its series with `model_name` (the served model name) and no version; podium's own
series carry `model` and `version`. Engine panels attach the version by joining on
`podium:model_loaded`, which is 1 for each (instance, model, version) being served.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("podium.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
PODIUM_SEL = 'model=~"$model", version=~"$version"'
ENGINE_SEL = 'model_name=~"$model"'

# (instance, model_name) -> version, for engine series that know only the served model name.
VERSION_OF = (
    "on (instance, model_name) group_left (version) max by (instance, model_name, version) ("
    'label_replace(podium:model_loaded{version=~"$version"} == 1, "model_name", "$1", "model", '
    '"(.*)"))'
)


def with_version(expr: str) -> str:
    """Attach `version` to an engine expression that keeps `instance` and `model_name`."""
    return f"({expr}) * {VERSION_OF}"


def engine_rate(metric: str, by: str = "model_name, version") -> str:
    """Per-second rate of a vLLM counter, summed by model and version."""
    inner = f"sum by (instance, model_name) (rate({metric}{{{ENGINE_SEL}}}[{RATE}]))"
    return f"sum by ({by}) ({with_version(inner)})"


def engine_quantile(q: float, histogram: str) -> str:
    """Quantile of a vLLM histogram per model and version."""
    inner = f"sum by (instance, model_name, le) (rate({histogram}_bucket{{{ENGINE_SEL}}}[{RATE}]))"
    return f"histogram_quantile({q}, sum by (model_name, version, le) ({with_version(inner)}))"


def engine_gauge(metric: str, scale: str = "") -> str:
    """A vLLM gauge per model and version (summed over engines and instances)."""
    inner = f"sum by (instance, model_name) ({metric}{{{ENGINE_SEL}}}){scale}"
    return f"sum by (model_name, version) ({with_version(inner)})"


def podium_quantile(q: float, histogram: str, by: str) -> str:
    """Quantile of a podium histogram."""
    return (
        f"histogram_quantile({q}, sum by ({by}, le) "
        f"(rate({histogram}_bucket{{{PODIUM_SEL}}}[{RATE}])))"
    )


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}


def panel(
    title: str,
    unit: str,
    *targets: tuple[str, str],
    kind: str = "timeseries",
    description: str = "",
) -> dict[str, Any]:
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom"}},
        "targets": [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)],
    }


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


MV = "{{model_name}} v{{version}}"

PANELS: list[dict[str, Any]] = [
    row("Traffic"),
    panel(
        "Requests per second by protocol and code",
        "reqps",
        (
            f"sum by (protocol, code) (rate(podium:requests_total{{{PODIUM_SEL}}}[{RATE}]))",
            "{{protocol}} {{code}}",
        ),
    ),
    panel(
        "Error ratio by model and version",
        "percentunit",
        (
            f"sum by (model, version) (rate(podium:requests_total{{{PODIUM_SEL}, "
            f'code!~"2..|OK"}}[{RATE}])) / sum by (model, version) '
            f"(rate(podium:requests_total{{{PODIUM_SEL}}}[{RATE}]))",
            "{{model}} v{{version}}",
        ),
        description="Non-2xx HTTP and non-OK gRPC answers over all answers.",
    ),
    panel(
        "Request latency p50 / p99 by protocol",
        "s",
        (podium_quantile(0.5, "podium:request_duration_seconds", "protocol"), "p50 {{protocol}}"),
        (podium_quantile(0.99, "podium:request_duration_seconds", "protocol"), "p99 {{protocol}}"),
    ),
    panel(
        "In-flight requests",
        "short",
        (
            f"sum by (model, version, protocol) (podium:requests_in_flight{{{PODIUM_SEL}}})",
            "{{model}} v{{version}} {{protocol}}",
        ),
    ),
    row("Engine"),
    panel(
        "Token throughput",
        "short",
        (engine_rate("vllm:generation_tokens_total"), f"generated {MV}"),
        (engine_rate("vllm:prompt_tokens_total"), f"prompt {MV}"),
        description="Tokens per second.",
    ),
    panel(
        "Time to first token p50 / p99",
        "s",
        (engine_quantile(0.5, "vllm:time_to_first_token_seconds"), f"p50 {MV}"),
        (engine_quantile(0.99, "vllm:time_to_first_token_seconds"), f"p99 {MV}"),
    ),
    panel(
        "Inter-token latency p50 / p99",
        "s",
        (engine_quantile(0.5, "vllm:inter_token_latency_seconds"), f"p50 {MV}"),
        (engine_quantile(0.99, "vllm:inter_token_latency_seconds"), f"p99 {MV}"),
    ),
    panel(
        "End-to-end request latency p50 / p99",
        "s",
        (engine_quantile(0.5, "vllm:e2e_request_latency_seconds"), f"p50 {MV}"),
        (engine_quantile(0.99, "vllm:e2e_request_latency_seconds"), f"p99 {MV}"),
    ),
    panel(
        "KV cache usage",
        "percent",
        (engine_gauge("vllm:kv_cache_usage_perc", " * 100"), MV),
    ),
    panel(
        "Prefix cache hit rate",
        "percentunit",
        (
            f"{engine_rate('vllm:prefix_cache_hits_total')} / "
            f"{engine_rate('vllm:prefix_cache_queries_total')}",
            MV,
        ),
        description="Share of prompt tokens served from the prefix cache.",
    ),
    panel(
        "Scheduler queue: running / waiting",
        "short",
        (engine_gauge("vllm:num_requests_running"), f"running {MV}"),
        (engine_gauge("vllm:num_requests_waiting"), f"waiting {MV}"),
    ),
    panel(
        "Queue time p99",
        "s",
        (engine_quantile(0.99, "vllm:request_queue_time_seconds"), f"engine {MV}"),
        (
            podium_quantile(0.99, "podium:queue_duration_seconds", "model, version"),
            "batching {{model}} v{{version}}",
        ),
    ),
    panel(
        "Preemptions per second",
        "short",
        (engine_rate("vllm:num_preemptions_total"), MV),
    ),
    panel(
        "Finished requests by reason",
        "reqps",
        (
            engine_rate("vllm:request_success_total", "model_name, version, finished_reason"),
            f"{{{{finished_reason}}}} {MV}",
        ),
    ),
    row("Lifecycle"),
    panel(
        "Ready instances",
        "short",
        ("sum(podium:ready)", "ready"),
        ("count(podium:ready)", "total"),
        kind="stat",
    ),
    panel(
        "Model load / unload events",
        "short",
        (
            f"sum by (model, version, action, outcome) "
            f"(increase(podium:model_load_events_total{{{PODIUM_SEL}}}[$__range]))",
            "{{action}} {{outcome}} {{model}} v{{version}}",
        ),
        kind="stat",
    ),
    panel(
        "Model load duration p99",
        "s",
        (
            podium_quantile(0.99, "podium:model_load_duration_seconds", "model, version, action"),
            "{{action}} {{model}} v{{version}}",
        ),
    ),
    panel(
        "Boot step durations",
        "s",
        ("max by (instance, step) (podium:boot_step_duration_seconds)", "{{instance}} {{step}}"),
        kind="bargauge",
    ),
    panel(
        "Dynamic batch size p50 / p99",
        "short",
        (podium_quantile(0.5, "podium:batch_size", "model, version"), "p50 {{model}} v{{version}}"),
        (
            podium_quantile(0.99, "podium:batch_size", "model, version"),
            "p99 {{model}} v{{version}}",
        ),
    ),
]


def layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two panels per line, a full-width bar for each row."""
    y, x = 0, 0
    for pid, p in enumerate(panels, start=1):
        p["id"] = pid
        if p["type"] == "row":
            y, x = y + (8 if x else 0), 0
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        p["gridPos"] = {"h": 8, "w": 12, "x": x, "y": y}
        x = 12 - x
        if x == 0:
            y += 8
    return panels


def variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }


def dashboard() -> dict[str, Any]:
    """The whole dashboard as a dict."""
    return {
        "uid": "podium-overview",
        "title": "Podium",
        "description": "Podium instances: traffic, engine (vLLM) and lifecycle, per model/version.",
        "tags": ["podium", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "current": {}},
                variable("model", "label_values(podium:model_loaded, model)"),
                variable("version", 'label_values(podium:model_loaded{model=~"$model"}, version)'),
            ]
        },
        "panels": layout(PANELS),
    }


def render() -> str:
    """The JSON text written to dashboards/podium.json."""
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
