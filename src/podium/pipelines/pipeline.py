"""One pipeline package, loaded: its graph checked and prepared, a runner, its tracing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podium.package.manifest import PipelineManifest
from podium.pipelines.graph import Graph, build_graph
from podium.pipelines.runner import Runner, RunResult
from podium.pipelines.steps import StepEnv
from podium.pipelines.steps.base import ModelHost
from podium.pipelines.trace import Tracing, export_otlp


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

    async def run(self, inputs: dict[str, Any], request_id: str,
                  traceparent: str | None = None) -> RunResult:
        return await self.runner.run(inputs, request_id, traceparent)
