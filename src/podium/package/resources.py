"""What one instance of a package asks its runtime for: the manifest's `resources` field.

On `podium up --runtime ray` it is the instance actor's Ray resource request: Ray places the
actor only on a node that offers all of it (CPUs, GPUs, memory, and custom resources, which is
how a node is labelled with a region or an accelerator). The local runtime runs every instance
on its own machine and reads none of it. Checked here against Ray's own rules, so a package
Ray would refuse is refused at `podium pack` / announce, naming the field.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

RESOURCE_UNIT = 0.0001
"""Ray counts every resource in steps of 1/10,000; a finer request is refused by Ray."""
CUSTOM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
# Ray's own names for what the typed fields ask for: asked through `custom` Ray refuses them
_BUILT_IN = {"CPU": "cpus", "GPU": "gpus", "memory": "memory_mib",
             "object_store_memory": None}


class ResourceRequest(BaseModel):
    """Per instance: what a node must offer for Ray to place it there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(
        default=None, gt=0, le=1024,
        description="Ray CPUs per instance, e.g. 4 for a CPU LLM or 0.5 for a small model. "
        "None: `podium up --ray-cpus` (default 1).")
    gpus: float | None = Field(
        default=None, ge=0, le=1024,
        description="GPUs per instance: below 1 a share of one GPU, above 1 a whole number. "
        "None: for vLLM on a cluster with GPUs one per tensor x pipeline parallel rank, "
        "else 0.")
    memory_mib: int | None = Field(
        default=None, ge=1, le=1 << 30,
        description="Memory Ray reserves for the instance on its node (MiB, Ray's `memory` "
        "resource): nodes without that much free are skipped. None: nothing reserved.")
    custom: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources a node must offer, name -> amount, e.g. "
        "{\"region-eu\": 0.001} for a node started with `ray start --resources "
        "'{\"region-eu\": 1}'`, or {\"accelerator_type:A10G\": 0.001} (Ray sets that one on "
        "GPU nodes).")

    @field_validator("gpus")
    @classmethod
    def _whole_above_one(cls, value: float | None) -> float | None:
        if value is not None and value > 1 and not value.is_integer():
            raise ValueError(f"above 1 a GPU request must be whole (Ray shares a GPU only "
                             f"below 1); use {int(value)} or {int(value) + 1}")
        return _in_units(value)

    @field_validator("cpus")
    @classmethod
    def _cpu_units(cls, value: float | None) -> float | None:
        return _in_units(value)

    @field_validator("custom")
    @classmethod
    def _custom_names(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in _BUILT_IN:
                typed = _BUILT_IN[name]
                raise ValueError(f"{name!r} is not a custom resource; "
                                 + (f"use resources.{typed}" if typed else "remove it"))
            if not CUSTOM_NAME.match(name):
                raise ValueError(f"{name!r} is not a resource name: use letters, digits and "
                                 "_ . : / - (at most 128), e.g. region-eu")
            if not 0 < amount <= 1_000_000:
                raise ValueError(f"{name}={amount} is out of range; ask for an amount in "
                                 "(0, 1000000], e.g. 0.001 to need the resource without "
                                 "using it up")
            _in_units(amount, name)
        return value


def _in_units(value: float | None, name: str = "the amount") -> float | None:
    if value is not None and value and round(value / RESOURCE_UNIT) == 0:
        raise ValueError(f"{name}={value} is finer than Ray counts ({RESOURCE_UNIT:g}); "
                         f"use at least {RESOURCE_UNIT:g}")
    return value
