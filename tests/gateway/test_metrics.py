"""The gateway's /metrics text, as Prometheus reads it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from podium.gateway.metrics import render
from podium.routes.stats import VersionStats
from podium.routes.table import Endpoint, RouteTable


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_every_family_is_typed_and_odd_label_values_survive() -> None:
    table, stats = RouteTable(), VersionStats()
    odd = 'a"b\\c\nd'  # a model name is the client's choice: quotes, backslashes, newlines
    stats.totals[(odd, "1")] = [5, 2, 1.25]
    stats.record_shed(odd, "1", "gateway")
    stats.record_retry(odd, "1", "canary")
    table.add_endpoint(odd, "1", Endpoint(id="i-1", url="http://x", num_in_flight=3,
                                          draining=True))
    table.set_split(odd, {"1": 100})
    text = render(table, stats)
    for name, kind in (("podium:gateway_requests", "counter"),
                       ("podium:gateway_request_seconds", "summary"),
                       ("podium:gateway_shed", "counter"),
                       ("podium:gateway_retries", "counter"),
                       ("podium:gateway_in_flight", "gauge"),
                       ("podium:gateway_instance_up", "gauge"),
                       ("podium:gateway_split_weight", "gauge")):
        assert f"# TYPE {name}" in text and kind in text.split(f"# TYPE {name}")[1][:40]
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for samples in families(text).values() for s in samples}
    version = (("model", odd), ("version", "1"))
    assert got[("podium:gateway_requests_total", (*version[:1], ("outcome", "ok"),
                                                  *version[1:]))] == 3
    assert got[("podium:gateway_requests_total", (*version[:1], ("outcome", "error"),
                                                  *version[1:]))] == 2
    assert got[("podium:gateway_request_seconds_sum", version)] == 1.25
    assert got[("podium:gateway_request_seconds_count", version)] == 5
    assert got[("podium:gateway_shed_total", (("by", "gateway"), *version))] == 1
    assert got[("podium:gateway_retries_total", (*version[:1], ("reason", "canary"),
                                                 *version[1:]))] == 1
    instance = (("instance", "i-1"), *version)
    assert got[("podium:gateway_in_flight", instance)] == 3
    assert got[("podium:gateway_instance_up", instance)] == 0  # draining takes no new requests
    assert got[("podium:gateway_split_weight", version)] == 100


def test_an_idle_gateway_still_declares_its_metrics() -> None:
    text = render(RouteTable(), VersionStats())
    assert "# TYPE podium:gateway_requests" in text and "# TYPE podium:gateway_split_weight" in text
    assert families(text)["podium:gateway_requests"] == []
