"""A pipeline's graph: its steps parsed by kind and checked as a whole at load.

Every refusal is a `PackageError` naming the step: an unknown kind, a bad setting, a reference
to no step or input, a `when_variant` naming no variant, a cycle, a model that exists neither
in this instance nor behind the pipeline's `gateway_url`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from podium.errors import PackageError
from podium.package.manifest import PipelineOutput, TensorSpec
from podium.pipelines import refs
from podium.pipelines.steps import KINDS, StepEnv, StepSpec
from podium.pipelines.steps.experiment import ExperimentStep
from podium.validation import describe


@dataclass
class Graph:
    """Steps in a runnable order, each with the steps it waits for."""

    steps: dict[str, StepSpec]
    depends: dict[str, list[str]]
    gate: dict[str, ExperimentStep]
    """step → the experiment whose variant decides whether it runs (`when_variant`)."""
    outputs: list[PipelineOutput]

    def experiments(self) -> list[ExperimentStep]:
        return [s for s in self.steps.values() if isinstance(s, ExperimentStep)]


def build_graph(raw_steps: Sequence[dict[str, Any]], inputs: Sequence[TensorSpec],
                outputs: Sequence[PipelineOutput], env: StepEnv) -> Graph:
    """Parse, check and prepare a pipeline's steps."""
    steps = _parse(raw_steps)
    input_names = {spec.name for spec in inputs}
    depends = {name: _depends(step, steps, input_names) for name, step in steps.items()}
    for output in outputs:
        _check_refs(f"output {output.name!r}", output.source, steps, input_names)
    gate = {name: _gate(step, steps) for name, step in steps.items() if step.when_variant}
    for name, experiment in gate.items():
        if experiment.name not in depends[name]:
            depends[name].append(experiment.name)
    order = _order(depends)
    for name in order:
        step = steps[name]
        try:
            step.prepare(env)
        except PackageError as exc:
            message = exc.message if f"step {name!r}" in exc.message else (
                f"step {name!r} ({step.kind}): {exc.message}")
            raise PackageError(message, param=name) from None
    return Graph({name: steps[name] for name in order}, depends, gate, list(outputs))


def _parse(raw_steps: Sequence[dict[str, Any]]) -> dict[str, StepSpec]:
    steps: dict[str, StepSpec] = {}
    for index, raw in enumerate(raw_steps):
        name = raw.get("name") if isinstance(raw, dict) else None
        where = f"step {name!r}" if isinstance(name, str) else f"steps[{index}]"
        if not isinstance(name, str):
            raise PackageError(f"{where}: every step needs a `name`", param="steps")
        if name == refs.INPUT:
            raise PackageError(f"{where}: `input` is reserved (it names the request's inputs); "
                               "rename the step", param=name)
        kind = raw.get("kind")
        if kind not in KINDS:
            raise PackageError(f"{where}: kind={kind!r} is unknown; use one of "
                               f"{', '.join(KINDS)}", param=name)
        if name in steps:
            raise PackageError(f"{where}: the name is used twice; names are unique",
                               param=name)
        try:
            steps[name] = KINDS[kind].model_validate(raw)
        except ValidationError as exc:
            problem = describe(exc).replace("body: ", "").replace("Value error, ", "")
            raise PackageError(f"{where} ({kind}): {problem}", param=name) from None
    return steps


def _depends(step: StepSpec, steps: dict[str, StepSpec], inputs: set[str]) -> list[str]:
    found: list[str] = []
    for value in step.settings().values():
        for alternatives in _refs_of(f"step {step.name!r}", value):
            for ref in alternatives:
                _check_ref(f"step {step.name!r}", ref, steps, inputs)
                if ref.root != refs.INPUT and ref.root not in found:
                    found.append(ref.root)
    for name in step.after:
        if name not in steps:
            raise PackageError(f"step {step.name!r}: after={name!r} names no step "
                               f"(steps: {', '.join(steps)})", param=step.name)
        if name not in found:
            found.append(name)
    if step.name in found:
        raise PackageError(f"step {step.name!r} reads its own result; a step reads only "
                           "earlier steps", param=step.name)
    return found


def _refs_of(where: str, value: Any) -> list[list[refs.Ref]]:
    try:
        return list(refs.walk(value))
    except ValueError as exc:
        raise PackageError(f"{where}: {exc}") from None


def _check_refs(where: str, text: str, steps: dict[str, StepSpec], inputs: set[str]) -> None:
    for alternatives in _refs_of(where, text):
        for ref in alternatives:
            _check_ref(where, ref, steps, inputs)


def _check_ref(where: str, ref: refs.Ref, steps: dict[str, StepSpec], inputs: set[str]
               ) -> None:
    if ref.root == refs.INPUT:
        if not ref.path or ref.path[0] not in inputs:
            wanted = ref.path[0] if ref.path else ""
            raise PackageError(f"{where}: `$input.{wanted}` is not a declared input (inputs: "
                               f"{', '.join(sorted(inputs))})", param="inputs")
    elif ref.root not in steps:
        raise PackageError(f"{where}: `${ref.root}` names no step or input (steps: "
                           f"{', '.join(steps)}; inputs are `$input.NAME`)",
                           param=where.split("'")[1] if "'" in where else None)


def _gate(step: StepSpec, steps: dict[str, StepSpec]) -> ExperimentStep:
    experiments = [s for s in steps.values() if isinstance(s, ExperimentStep)]
    if step.experiment is not None:
        chosen = steps.get(step.experiment)
        if not isinstance(chosen, ExperimentStep):
            raise PackageError(f"step {step.name!r}: experiment={step.experiment!r} names no "
                               "experiment step", param=step.name)
    elif len(experiments) == 1:
        chosen = experiments[0]
    else:
        raise PackageError(f"step {step.name!r}: when_variant needs "
                           f"{'an experiment step' if not experiments else '`experiment`'} "
                           f"(experiments: {', '.join(e.name for e in experiments) or 'none'})",
                           param=step.name)
    unknown = [v for v in step.when_variant or [] if v not in chosen.variant_names()]
    if unknown:
        raise PackageError(f"step {step.name!r}: when_variant names {unknown}, which "
                           f"experiment {chosen.name!r} does not have (variants: "
                           f"{', '.join(chosen.variant_names())})", param=step.name)
    return chosen


def _order(depends: dict[str, list[str]]) -> list[str]:
    """A topological order; a cycle is refused naming its steps."""
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in depends:
        if state.get(start) == 2:
            continue
        path, stack = [start], [iter(depends[start])]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                done = path.pop()
                stack.pop()
                state[done] = 2
                order.append(done)
            elif state.get(nxt) == 1:
                cycle = [*path[path.index(nxt):], nxt]
                raise PackageError(f"steps {' → '.join(cycle)} form a cycle; a pipeline is a "
                                   "graph without cycles", param=nxt)
            elif state.get(nxt) != 2:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(depends[nxt]))
    return order
