"""What every manifest has (name, version, frontends, resources, …), apart from the backend
models built on it (`manifest`, `lora_manifest`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from podium.package.resources import ResourceRequest
from podium.package.scaling import ScalingTargets

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$"
FRONTEND_MODES = ("embedded", "standalone")
"""What an instance serving the package runs: embedded (OpenAI /v1 + KServe v2, the default) or
standalone (KServe v2 HTTP and gRPC only)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ManifestBase(_Strict):
    name: str = Field(pattern=NAME_PATTERN, description="Model name as clients address it.")
    version: str = Field(default="1", pattern=VERSION_PATTERN, description="Model version.")
    description: str = Field(default="", description="Free text shown by `podium inspect`.")
    engine_version: str | None = Field(
        default=None,
        description="Optional; if given it must equal the platform's pinned vLLM version.")
    idempotent: bool = Field(
        default=True,
        description="Whether a request may be sent twice: during a rollout the gateway resends "
        "a request the new version failed to the stable one. False for a model with side "
        "effects (it writes, charges or sends something per request).")
    autoscale: ScalingTargets | None = Field(
        default=None, description="Autoscaling targets per instance (bounds: `podium scale`).")

    resources: ResourceRequest = Field(
        default_factory=ResourceRequest,
        description="What each instance asks a Ray cluster for (CPUs, GPUs, memory, custom "
        "resources such as a region); the local runtime ignores it.")

    frontends: Literal[FRONTEND_MODES] = Field(
        default="embedded",
        description="embedded: the instance serves OpenAI /v1 and KServe v2 (HTTP and gRPC); "
        "standalone: KServe v2 HTTP and gRPC only, the OpenAI layer and vLLM's serving "
        "classes are neither imported nor built, and /v1 answers 404 "
        "naming the mode.")

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_str(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value
