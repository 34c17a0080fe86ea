"""Every step is a span under the pipeline's root span, joined to the caller's trace; every
step writes one JSON line and counts in `podium:pipeline_step_*`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from podium.pipelines import trace
from tests.support.pipelines import build

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"
STEPS = [
    {"name": "arm", "kind": "experiment", "key": "$input.member_id", "salt": "s",
     "variants": [{"name": "only", "weight": 1}]},
    {"name": "a", "kind": "python", "function": "f.py:items", "args": {}},
    {"name": "b", "kind": "model", "model": "scorer", "inputs": {"features": [[1.0, 2.0]]}},
    {"name": "c", "kind": "python", "function": "f.py:items", "args": {"x": "$a", "y": "$b"}},
]


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    trace.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_one_span_per_step_parent_linked_under_the_callers_trace(tmp_path: Path, models,
                                                                 exporter) -> None:
    (tmp_path / "f.py").write_text("def items(**kw):\n    return {'items': [1, 2, 3]}\n")
    exporter.clear()
    pipeline = build(tmp_path, models, STEPS)
    result = asyncio.run(pipeline.run({"member_id": "m"}, "req-7", TRACEPARENT))
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"pipeline p", "step arm", "step a", "step b", "step c"}
    root = spans["pipeline p"]
    assert format(root.context.trace_id, "032x") == CALLER_TRACE == result.trace_id
    assert format(root.parent.span_id, "016x") == "b7ad6b7169203331"
    for name in ("arm", "a", "b", "c"):
        span = spans[f"step {name}"]
        assert span.parent.span_id == root.context.span_id
        assert span.attributes["podium.outcome"] == "ok"
        assert span.attributes["podium.variant"] == "only"


def test_each_step_writes_one_json_line_and_counts_in_metrics(tmp_path: Path, models) -> None:
    from podium.metrics.server import REGISTRY

    (tmp_path / "f.py").write_text("def items(**kw):\n    return {'items': [1, 2, 3]}\n")
    pipeline = build(tmp_path, models, STEPS, trace_log="steps.jsonl")
    before = REGISTRY.get_sample_value(
        "podium:pipeline_step_total",
        {"pipeline": "p", "step": "c", "variant": "only", "outcome": "ok"}) or 0
    asyncio.run(pipeline.run({"member_id": "m"}, "req-8"))
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert sorted(line["step"] for line in lines) == ["a", "arm", "b", "c"]
    c = next(line for line in lines if line["step"] == "c")
    assert c["request_id"] == "req-8" and c["outcome"] == "ok" and c["variant"] == "only"
    assert c["sizes"]["items"] == 3 and c["duration_ms"] >= 0
    after = REGISTRY.get_sample_value(
        "podium:pipeline_step_total",
        {"pipeline": "p", "step": "c", "variant": "only", "outcome": "ok"})
    assert after == before + 1


def test_the_sampled_debug_log_holds_full_payloads_only_when_turned_on(
        tmp_path: Path, models, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "f.py").write_text("def items(**kw):\n    return {'items': [1, 2, 3]}\n")
    caplog.set_level("INFO", logger="podium.pipeline.debug")
    asyncio.run(build(tmp_path, models, STEPS).run({"member_id": "m"}, "off"))
    assert not [r for r in caplog.records if r.name == "podium.pipeline.debug"]
    asyncio.run(build(tmp_path, models, STEPS, debug_sample_rate=1.0).run(
        {"member_id": "m"}, "on"))
    payloads = [json.loads(r.getMessage()) for r in caplog.records
                if r.name == "podium.pipeline.debug"]
    assert {p["step"] for p in payloads} == {"arm", "a", "b", "c"}
    c = next(p for p in payloads if p["step"] == "c")
    assert c["request_id"] == "on" and c["result"] == {"items": [1, 2, 3]}
    assert c["args"]["args"]["x"] == {"items": [1, 2, 3]}  # its resolved arguments


def test_with_nothing_receiving_spans_they_are_ids_still_joined_to_the_callers_trace(
        tmp_path: Path, models, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "_recording", False)  # no processor in this process
    (tmp_path / "f.py").write_text("def items(**kw):\n    return {'items': [1, 2, 3]}\n")
    pipeline = build(tmp_path, models, STEPS)
    joined = asyncio.run(pipeline.run({"member_id": "m"}, "req-9", TRACEPARENT))
    assert joined.trace_id == CALLER_TRACE and joined.outputs is not None
    own = {asyncio.run(pipeline.run({"member_id": "m"}, f"req-{n}")).trace_id for n in range(2)}
    assert len(own) == 2 and all(len(t) == 32 and int(t, 16) for t in own)

    tracing = trace.Tracing("p", "1")
    with tracing.request_span("req", TRACEPARENT) as root, tracing.step_span("a", "python") as step:
        passed_on = trace.traceparent_of(step)
    assert passed_on is not None
    version, trace_id, span_id, flags = passed_on.split("-")
    assert (version, trace_id, flags) == ("00", CALLER_TRACE, "01")
    assert span_id not in ("b7ad6b7169203331", format(root.get_span_context().span_id, "016x"))
