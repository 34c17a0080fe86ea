"""`experiment`: sticky allocation of a request key to weighted variants.

The key (e.g. a member id) is hashed with the experiment's salt (SHA-256, so every process and
every release agrees); the first 8 bytes as a fraction of 2**64 fall in one variant's share of
the weights. Same key and salt → same variant; a new salt reshuffles everyone.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from podium.errors import InvalidArgument
from podium.pipelines.steps.base import CallContext, StepSpec


class Variant(BaseModel):
    """One arm: its share of keys and the parameters downstream steps read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,63}$")
    weight: float = Field(gt=0, description="Relative share of keys.")
    params: dict[str, Any] = Field(default_factory=dict, description="Read downstream as "
                                   "`$step.params.NAME` (a model, a prompt, a parameter).")


class ExperimentStep(StepSpec):
    """Result: `{"variant": name, "params": {...}}`."""

    kind: Literal["experiment"]
    key: str = Field(description="Reference to the allocation key, e.g. `$input.member_id`.")
    salt: str = Field(min_length=1, description="Per-experiment salt.")
    variants: list[Variant] = Field(min_length=1, description="The arms and their weights.")

    @field_validator("variants")
    @classmethod
    def _unique(cls, variants: list[Variant]) -> list[Variant]:
        names = [arm.name for arm in variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names repeat: {names}")
        return variants

    def variant_names(self) -> list[str]:
        return [arm.name for arm in self.variants]

    def allocate(self, key: Any) -> Variant:
        """The variant `key` is in (stable across processes and restarts)."""
        if key is None or isinstance(key, dict | list):
            raise InvalidArgument(f"experiment {self.name!r}: the key must be a string or a "
                                  f"number, got {type(key).__name__}", param=self.name)
        digest = hashlib.sha256(f"{self.salt}\0{key}".encode()).digest()
        total = sum(arm.weight for arm in self.variants)
        point = int.from_bytes(digest[:8], "big") / 2**64 * total
        for arm in self.variants:
            if point < arm.weight:
                return arm
            point -= arm.weight
        return self.variants[-1]  # float rounding at the very top

    async def run(self, args: dict[str, Any], call: CallContext) -> Any:
        arm = self.allocate(args["key"])
        return {"variant": arm.name, "params": dict(arm.params)}
