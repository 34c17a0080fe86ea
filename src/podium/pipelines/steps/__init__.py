"""Step kinds by name: each one module, one pydantic settings model with `prepare` and `run`."""

from __future__ import annotations

from podium.pipelines.steps.base import CallContext, StepEnv, StepSpec
from podium.pipelines.steps.candidates import CandidatesStep
from podium.pipelines.steps.experiment import ExperimentStep
from podium.pipelines.steps.features import FeaturesStep
from podium.pipelines.steps.model import ModelStep
from podium.pipelines.steps.python_step import PythonStep

KINDS: dict[str, type[StepSpec]] = {
    "experiment": ExperimentStep,
    "features": FeaturesStep,
    "candidates": CandidatesStep,
    "model": ModelStep,
    "python": PythonStep,
}

__all__ = ["KINDS", "CallContext", "StepEnv", "StepSpec"]
