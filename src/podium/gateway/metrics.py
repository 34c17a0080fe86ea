"""The gateway's own `/metrics`: traffic per version, instances, splits.

A prometheus_client collector reads the route table and the lifetime totals at scrape time,
so the values are never copied; prometheus_client writes (and escapes) the exposition.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from podium.gateway.hold import Hold
from podium.routes.stats import VersionStats
from podium.routes.table import RouteTable

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
_VERSION = ["model", "version"]


class GatewayCollector(Collector):
    """Every gateway metric, read from the route table and the request totals."""

    def __init__(self, table: RouteTable, stats: VersionStats, hold: Hold | None = None) -> None:
        self.table = table
        self.stats = stats
        self.hold = hold

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "podium:gateway_requests", "Requests proxied, by model, version and outcome.",
            labels=[*_VERSION, "outcome"])
        seconds = SummaryMetricFamily(
            "podium:gateway_request_seconds",
            "Time from receiving a request to the end of its answer.", labels=_VERSION)
        for (model, version), (num, errors, total_s) in sorted(self.stats.totals.items()):
            requests.add_metric([model, version, "ok"], int(num - errors))
            requests.add_metric([model, version, "error"], int(errors))
            seconds.add_metric([model, version], count_value=int(num), sum_value=total_s)
        shed = CounterMetricFamily(
            "podium:gateway_shed", "Requests answered 429 without being served, by model, "
            "version and who shed them (the gateway's in-flight bound, or the instance).",
            labels=[*_VERSION, "by"])
        for (model, version, by), num in sorted(self.stats.shed.items()):
            shed.add_metric([model, version, by], num)
        retries = CounterMetricFamily(
            "podium:gateway_retries", "Requests sent again after failing on this version, by "
            "reason (not_sent, overloaded, broken, canary).", labels=[*_VERSION, "reason"])
        for (model, version, reason), num in sorted(self.stats.retried.items()):
            retries.add_metric([model, version, reason], num)
        prefix = CounterMetricFamily(
            "podium:gateway_prefix_picks", "Instances picked for an LLM prompt by prefix cache, "
            "by outcome: affinity (the longest cached prefix), yielded (away from it, for "
            "load), cold (no instance held any of it).", labels=[*_VERSION, "outcome"])
        for (model, version, outcome), num in sorted(self.stats.prefix_picks.items()):
            prefix.add_metric([model, version, outcome], num)
        in_flight = GaugeMetricFamily("podium:gateway_in_flight",
                                      "Requests in flight per instance.",
                                      labels=[*_VERSION, "instance"])
        up = GaugeMetricFamily("podium:gateway_instance_up",
                               "1 when the instance takes new requests.",
                               labels=[*_VERSION, "instance"])
        for model, version, endpoint in self.table.routed():
            in_flight.add_metric([model, version, endpoint.id], endpoint.num_in_flight)
            up.add_metric([model, version, endpoint.id], int(endpoint.can_take))
        weights = GaugeMetricFamily("podium:gateway_split_weight",
                                    "Percent of a model's traffic per version.", labels=_VERSION)
        for model in sorted(self.table.models()):
            for version, weight in sorted(self.table.split(model).items()):
                weights.add_metric([model, version], weight)
        yield from (requests, seconds, shed, retries, prefix, in_flight, up, weights)
        if self.hold is not None:
            yield from _cold_starts(self.hold)


def _cold_starts(hold: Hold) -> Iterator[Metric]:
    """Requests held for a version at zero instances (`gateway.hold`)."""
    held = GaugeMetricFamily("podium:gateway_held", "Requests held now, waiting for an "
                             "instance of a version at zero to start.", labels=_VERSION)
    for model, versions in sorted(hold.counts().items()):
        for version, num in sorted(versions.items()):
            held.add_metric([model, version], num)
    waited = SummaryMetricFamily(
        "podium:gateway_cold_start_wait_seconds", "Time held requests waited for an "
        "instance of a version at zero before going on.", labels=_VERSION)
    for (model, version), (num, total_s) in sorted(hold.waited.items()):
        waited.add_metric([model, version], count_value=num, sum_value=total_s)
    refused = CounterMetricFamily(
        "podium:gateway_cold_start_refused", "Held requests answered 503 with Retry-After, "
        "by why: full (too many held) or timeout (no instance in time).",
        labels=[*_VERSION, "why"])
    for (model, version, why), num in sorted(hold.refused.items()):
        refused.add_metric([model, version, why], num)
    yield from (held, waited, refused)


def render(table: RouteTable, stats: VersionStats, hold: Hold | None = None) -> str:
    """Every gateway metric, current values, in the Prometheus text format.

    A registry of this gateway's collector alone, never the process-wide default (which would
    mix in whatever else the process registers there).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(table, stats, hold))
    return generate_latest(registry).decode()
