"""One pipeline package, loaded: its graph checked and prepared, a runner, its tracing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.package.manifest import PipelineManifest
from podium.pipelines.cache import ResultCache
from podium.pipelines.graph import Graph, build_graph
from podium.pipelines.runner import Runner, RunResult
from podium.pipelines.steps import StepEnv
from podium.pipelines.steps.base import ModelHost
from podium.pipelines.trace import Tracing, export_otlp


@dataclass
class Answer:
    """What a request gets: outputs, the variant, which path answered, the trace id."""

    outputs: dict[str, Any]
    variant: str
    path: str
    """`live` (computed now) or `cache` (precomputed by `podium batch`, still fresh)."""
    trace_id: str


class Pipeline:
    """A served pipeline: `run(inputs)` answers one request."""

    def __init__(self, manifest: PipelineManifest, root: Path,
                 models: ModelHost | None = None) -> None:
        self.manifest = manifest
        env = StepEnv(root=root, models=models, gateway_url=manifest.gateway_url)
        self.graph: Graph = build_graph(manifest.steps, manifest.inputs, manifest.outputs, env)
        trace_log = Path(manifest.trace_log) if manifest.trace_log else None
        if trace_log is not None and not trace_log.is_absolute():
            trace_log = root / trace_log
        self.tracing = Tracing(manifest.name, manifest.version, trace_log,
                               manifest.debug_sample_rate)
        if manifest.otlp_endpoint:
            export_otlp(manifest.otlp_endpoint)
        self.runner = Runner(self.graph, self.tracing, manifest.deadline_ms)
        self.cache = (ResultCache(manifest.result_cache, root, manifest.name, manifest.version)
                      if manifest.result_cache is not None else None)

    async def answer(self, inputs: dict[str, Any], request_id: str,
                     traceparent: str | None = None) -> Answer:
        """The fresh precomputed answer for the request's key, else a live run."""
        if self.cache is not None and inputs.get(self.cache.settings.key) is not None:
            cached = await asyncio.to_thread(self.cache.get,
                                             str(inputs[self.cache.settings.key]))
            if cached is not None:
                return Answer(cached.outputs, cached.variant, "cache", "")
        result = await self.run(inputs, request_id, traceparent)
        return Answer(result.outputs, result.variant, "live", result.trace_id)

    async def run(self, inputs: dict[str, Any], request_id: str,
                  traceparent: str | None = None) -> RunResult:
        return await self.runner.run(inputs, request_id, traceparent)
