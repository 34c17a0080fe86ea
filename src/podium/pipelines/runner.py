"""One request through a pipeline's graph.

Every step is a task that waits for the steps it reads, so independent steps run
concurrently. A step runs within its own timeout and what is left of the request deadline; an
error or timeout goes to its fallback: `fail` fails the request, `skip` answers null, `default`
answers the step's `default`. A step gated by `when_variant` answers null for other variants.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from podium.errors import BackendError, PodiumError, RequestError, RequestTimeout
from podium.pipelines import refs
from podium.pipelines.graph import Graph
from podium.pipelines.steps import CallContext, StepSpec
from podium.pipelines.trace import StepRecord, Tracing, now, traceparent_of


@dataclass
class RunResult:
    """A finished request: every step's result, the outputs and the variant."""

    outputs: dict[str, Any]
    results: dict[str, Any]
    variant: str
    """The request's experiment variants joined with `,` ("" without an experiment)."""
    trace_id: str


class Runner:
    """Runs requests through one pipeline's graph."""

    def __init__(self, graph: Graph, tracing: Tracing, deadline_ms: int) -> None:
        self.graph = graph
        self.tracing = tracing
        self.deadline_s = deadline_ms / 1000
        # settings without references need no resolving per request
        self._static = {name: step.settings() for name, step in graph.steps.items()
                        if not any(True for _ in refs.walk(step.settings()))}
        self._experiments = [e.name for e in graph.experiments()]

    async def run(self, inputs: dict[str, Any], request_id: str,
                  traceparent: str | None = None) -> RunResult:
        scope: dict[str, Any] = {refs.INPUT: inputs}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s
        debug = self.tracing.sampled()
        with self.tracing.request_span(request_id, traceparent) as root:
            tasks: dict[str, asyncio.Task[None]] = {}
            try:
                async with asyncio.TaskGroup() as group:
                    for name in self.graph.steps:  # topological: dependencies come first
                        tasks[name] = group.create_task(
                            self._step(name, tasks, scope, deadline, request_id, debug))
            except* PodiumError as failed:
                raise failed.exceptions[0] from None
            variant = self._variant(scope)
            root.set_attribute("podium.variant", variant)
            outputs = {o.name: refs.resolve(o.source, scope) for o in self.graph.outputs}
            trace_id = format(root.get_span_context().trace_id, "032x")
        return RunResult(outputs, {k: v for k, v in scope.items() if k != refs.INPUT},
                         variant, trace_id)

    async def _step(self, name: str, tasks: dict[str, asyncio.Task[None]],
                    scope: dict[str, Any], deadline: float, request_id: str,
                    debug: bool) -> None:
        for dependency in self.graph.depends[name]:
            await tasks[dependency]
        step = self.graph.steps[name]
        loop = asyncio.get_running_loop()
        started = now()
        record = StepRecord(request_id, self.tracing.pipeline, self.tracing.version, name,
                            step.kind, 0.0, "ok", self._variant(scope))
        with self.tracing.step_span(name, step.kind) as span:
            args: Any = None
            value: Any = None
            try:
                if not self._runs(name, scope):
                    record.outcome, value = "not_run", None
                else:
                    left = deadline - loop.time()
                    timeout = min(left, step.timeout_ms / 1000) if step.timeout_ms else left
                    args = self._static.get(name) or refs.resolve(step.settings(), scope)
                    call = CallContext(request_id, traceparent_of(span), max(timeout, 0.0))
                    if timeout <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(timeout):  # no extra task, as wait_for made
                        value = await step.run(args, call)
            except TimeoutError:
                record.outcome = "timeout"
                value = self._fallback(step, record, RequestTimeout(
                    f"step {name!r} timed out (timeout_ms={step.timeout_ms}, request "
                    f"deadline {self.deadline_s * 1000:.0f} ms)"))
            except Exception as exc:  # every step error goes to its fallback
                record.outcome, record.error = "error", f"{type(exc).__name__}: {exc}"
                value = self._fallback(step, record, exc)
            finally:
                record.duration_ms = round((now() - started) * 1000, 3)
                record.variant = self._variant({**scope, name: value})
                self.tracing.record(record, span, value)
            scope[name] = value
            if debug:
                self.tracing.debug(request_id, name, args, value)

    def _fallback(self, step: StepSpec, record: StepRecord, exc: Exception) -> Any:
        record.fallback = step.fallback
        if step.fallback == "skip":
            return None
        if step.fallback == "default":
            return step.default
        if isinstance(exc, PodiumError):
            if not isinstance(exc, RequestError) or f"step {step.name!r}" in exc.message:
                raise exc
            raise type(exc)(f"step {step.name!r}: {exc.message}", param=exc.param) from exc
        raise BackendError(f"step {step.name!r} failed: {type(exc).__name__}: {exc}") from exc

    def _runs(self, name: str, scope: dict[str, Any]) -> bool:
        experiment = self.graph.gate.get(name)
        if experiment is None:
            return True
        chosen = scope.get(experiment.name)
        step = self.graph.steps[name]
        return isinstance(chosen, dict) and chosen.get("variant") in (step.when_variant or [])

    def _variant(self, scope: dict[str, Any]) -> str:
        chosen = [scope[name]["variant"] for name in self._experiments
                  if isinstance(scope.get(name), dict)]
        return ",".join(chosen)
