"""The gateway's own `/metrics` (Prometheus text): traffic per version, instances, splits."""

from __future__ import annotations

from podium.gateway.routing import RouteTable
from podium.gateway.stats import VersionStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(table: RouteTable, stats: VersionStats) -> str:
    """Every gateway metric, current values."""
    lines = [
        "# HELP podium:gateway_requests Requests proxied, by model, version and outcome.",
        "# TYPE podium:gateway_requests counter",
    ]
    totals = sorted(stats.totals.items())
    for (model, version), (num, errors, _seconds) in totals:
        for outcome, value in (("ok", num - errors), ("error", errors)):
            lines.append(f'podium:gateway_requests_total{{{_labels(model, version)},'
                         f'outcome="{outcome}"}} {int(value)}')
    lines += ["# HELP podium:gateway_request_seconds Time from receiving a request to the end "
              "of its answer.", "# TYPE podium:gateway_request_seconds summary"]
    for (model, version), (num, _errors, seconds) in totals:
        lines.append(f"podium:gateway_request_seconds_count{{{_labels(model, version)}}} "
                     f"{int(num)}")
        lines.append(f"podium:gateway_request_seconds_sum{{{_labels(model, version)}}} "
                     f"{seconds:.6f}")
    lines += ["# HELP podium:gateway_in_flight Requests in flight per instance.",
              "# TYPE podium:gateway_in_flight gauge",
              "# HELP podium:gateway_instance_up 1 when the instance takes new requests.",
              "# TYPE podium:gateway_instance_up gauge"]
    for model, version, endpoint in table.routed():
        labels = f'{_labels(model, version)},instance="{endpoint.id}"'
        lines.append(f"podium:gateway_in_flight{{{labels}}} {endpoint.num_in_flight}")
        lines.append(f"podium:gateway_instance_up{{{labels}}} {int(endpoint.can_take)}")
    lines += ["# HELP podium:gateway_split_weight Percent of a model's traffic per version.",
              "# TYPE podium:gateway_split_weight gauge"]
    for model in sorted(table.models()):
        for version, weight in sorted(table.split(model).items()):
            lines.append(f"podium:gateway_split_weight{{{_labels(model, version)}}} {weight}")
    return "\n".join(lines) + "\n"


def _labels(model: str, version: str) -> str:
    return f'model="{_escape(model)}",version="{_escape(version)}"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
