"""podium:* server metrics: fixed label sets, recording helpers, closed label values."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from podium.metrics import server


def sample(name: str, **labels: str) -> float:
    """The exposed value of one series; a series that is not exposed fails the test."""
    value = server.REGISTRY.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exposed"
    return value


def before(name: str, **labels: str) -> float:
    """A counter's value before the test adds to it: 0 while the series does not exist yet."""
    return server.REGISTRY.get_sample_value(name, labels) or 0.0


def test_observe_request_counts_and_times_per_protocol() -> None:
    labels = dict(model="m", version="3", protocol="kserve_grpc", endpoint="ModelInfer", code="OK")
    count, total = (
        before("podium:requests_total", **labels),
        before("podium:request_duration_seconds_sum", **labels),
    )
    server.observe_request("kserve_grpc", "ModelInfer", "m", "3", "OK", 0.25)
    server.observe_request("kserve_grpc", "ModelInfer", "m", "3", "OK", 0.5)
    assert sample("podium:requests_total", **labels) == count + 2
    assert sample("podium:request_duration_seconds_sum", **labels) == pytest.approx(total + 0.75)
    le = sample("podium:request_duration_seconds_bucket", **labels, le="0.25")
    assert le >= 1


def test_status_code_is_a_label_value() -> None:
    start = before(
        "podium:requests_total",
        model="m",
        version="1",
        protocol="openai",
        endpoint="/v1/chat/completions",
        code="429",
    )
    server.observe_request("openai", "/v1/chat/completions", "m", "1", 429, 0.01)
    after = sample(
        "podium:requests_total",
        model="m",
        version="1",
        protocol="openai",
        endpoint="/v1/chat/completions",
        code="429",
    )
    assert after == start + 1


@pytest.mark.parametrize("protocol", ["grpc", "OpenAI", "kserve"], ids=["grpc", "case", "bare"])
def test_unknown_protocol_is_rejected_with_its_name(protocol: str) -> None:
    with pytest.raises(ValueError, match=repr(protocol)):
        server.observe_request(protocol, "/x", "m", "1", 200, 0.1)  # type: ignore[arg-type]


def test_in_flight_drops_back_even_when_the_request_fails() -> None:
    labels = dict(
        model="m", version="1", protocol="kserve_http", endpoint="/v2/models/{name}/infer"
    )
    with server.track_in_flight("kserve_http", "/v2/models/{name}/infer", "m", "1"):
        assert sample("podium:requests_in_flight", **labels) == 1
        with (
            pytest.raises(RuntimeError),
            server.track_in_flight("kserve_http", "/v2/models/{name}/infer", "m", "1"),
        ):
            assert sample("podium:requests_in_flight", **labels) == 2
            raise RuntimeError("backend failed")
        assert sample("podium:requests_in_flight", **labels) == 1
    assert sample("podium:requests_in_flight", **labels) == 0


def test_load_and_unload_events_flip_model_loaded() -> None:
    server.observe_load("xgb", "7", "load", 1.5, ok=True)
    assert sample("podium:model_loaded", model="xgb", version="7") == 1
    assert (
        sample(
            "podium:model_load_events_total", model="xgb", version="7", action="load", outcome="ok"
        )
        >= 1
    )
    server.observe_load("xgb", "7", "unload", 0.1, ok=True)
    assert sample("podium:model_loaded", model="xgb", version="7") == 0
    errors = before(
        "podium:model_load_events_total", model="xgb", version="8", action="load", outcome="error"
    )
    server.observe_load("xgb", "8", "load", 0.2, ok=False)
    assert (
        sample(
            "podium:model_load_events_total",
            model="xgb",
            version="8",
            action="load",
            outcome="error",
        )
        == errors + 1
    )
    # a version that never loaded exposes no model_loaded series at all
    assert server.REGISTRY.get_sample_value("podium:model_loaded", {"model": "xgb",
                                                                    "version": "8"}) is None


def test_batch_sizes_and_queue_time() -> None:
    count = before("podium:batch_size_count", model="onnx", version="1")
    server.observe_batch("onnx", "1", 8)
    server.observe_batch("onnx", "1", 3)
    assert sample("podium:batch_size_count", model="onnx", version="1") == count + 2
    assert sample("podium:batch_size_bucket", model="onnx", version="1", le="4.0") >= 1
    with pytest.raises(ValueError, match="size=0"):
        server.observe_batch("onnx", "1", 0)
    server.observe_queue("onnx", "1", 0.003)
    assert sample("podium:queue_duration_seconds_count", model="onnx", version="1") >= 1


def test_boot_steps_and_readiness() -> None:
    server.observe_boot_step("engine", 31.5)
    server.observe_boot_step("warmup", 0.25)
    server.observe_boot_step("warmup", 0.75)  # a second boot: the scrape shows the latest
    assert sample("podium:boot_step_duration_seconds", step="engine") == 31.5
    scraped = generate_latest(server.REGISTRY).decode()
    assert 'podium:boot_step_duration_seconds{step="warmup"} 0.75' in scraped
    server.set_ready(True)
    assert sample("podium:ready") == 1
    server.set_ready(False)
    assert sample("podium:ready") == 0


def test_metric_names_lists_exposed_sample_names() -> None:
    names = server.metric_names()
    assert "podium:requests_total" in names
    assert "podium:request_duration_seconds_bucket" in names
    assert "podium:ready" in names
    assert "podium:requests" not in names  # a family name, not a sample a query can select
    assert all(n.startswith("podium:") for n in names)
