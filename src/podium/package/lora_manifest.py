"""LoRA in manifests: a base LLM's settings (`"lora": {...}` in a vLLM manifest) and the
adapter package (`"backend": "lora"`)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from podium.package.manifest_base import _ManifestBase

MAX_LORA_RANK = 512
"""The largest rank vLLM accepts (its own bound on `max_lora_rank`)."""
ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM takes for `max_lora_rank` (an adapter's own rank may be anything up to it)."""
BASE_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}@[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$"
"""An adapter's `base`: the base package as name@version."""


class LoraSettings(BaseModel):
    """How many adapters the engine holds and how big they may be. The defaults fit a small
    CPU machine: every slot costs max_lora_rank x (sum of the targeted layers' widths) of
    memory on each side, held for the engine's life."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_loras: int = Field(default=8, ge=1, le=64,
                           description="Adapters one engine step (batch) may mix.")
    max_lora_rank: int = Field(default=16, ge=1, le=MAX_LORA_RANK,
                               description="The largest adapter rank this engine serves; an "
                               "adapter of a higher rank is refused at announce.")
    max_cpu_loras: int | None = Field(
        default=8, ge=1, le=1024,
        description="Adapters kept loaded in memory (an LRU; the least recently used is "
        "evicted past it and loaded again on its next request). At least max_loras.")

    @model_validator(mode="after")
    def _cpu_at_least_slots(self) -> LoraSettings:
        if self.max_lora_rank not in ENGINE_RANKS:
            raise ValueError(f"lora.max_lora_rank={self.max_lora_rank} is not a rank vLLM "
                             f"serves; use one of {', '.join(map(str, ENGINE_RANKS))}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"lora.max_cpu_loras={self.max_cpu_loras} is below "
                             f"lora.max_loras={self.max_loras}; raise it to at least "
                             f"{self.max_loras}")
        return self

    def engine_args(self) -> dict[str, object]:
        """vLLM's engine arguments for these settings."""
        return {"enable_lora": True, "max_loras": self.max_loras,
                "max_lora_rank": self.max_lora_rank, "max_cpu_loras": self.max_cpu_loras}


class LoraManifest(_ManifestBase):
    """A LoRA adapter (PEFT's files) served on the engine of its base LLM, not on its own."""

    backend: Literal["lora"]
    base: str = Field(description="The base LLM package, name@version (e.g. "
                      "smollm2-135m-instruct@1); it must enable `lora`.")
    rank: int = Field(ge=1, le=MAX_LORA_RANK,
                      description="The adapter's rank: adapter_config.json's `r`.")
    path: str = Field(default=".", description="Folder in the package holding PEFT's "
                      "adapter_config.json and adapter_model.safetensors.")

    @field_validator("base")
    @classmethod
    def _base_is_a_version(cls, value: str) -> str:
        if not re.match(BASE_PATTERN, value):
            raise ValueError(f"must name the base package as name@version, e.g. "
                             f"{value.partition('@')[0] or 'smollm2-135m-instruct'}@1")
        return value
