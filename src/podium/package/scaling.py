"""A package's autoscaling targets (`autoscale` in podium.json), read by the control plane.

Bounds (`min_instances`, `max_instances`) belong to the deployment (`podium scale`); what a
package declares is how loaded one instance of it may be. Every field is optional: unset, the
control plane's default applies (docs/operations.md, "Autoscaling on the engine's signals").
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ScalingTargets(BaseModel):
    """Targets every backend can scale on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_in_flight: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Requests in flight per instance the autoscaler aims for (the gateway's "
        "count). None: the control plane's default (8).")
    scale_up_window_ms: int | None = Field(
        default=None, ge=0, le=3_600_000,
        description="How long a signal must stay over its target before an instance is added. "
        "None: 0 (at once).")
    scale_down_cooldown_ms: int | None = Field(
        default=None, ge=0, le=86_400_000,
        description="How long every signal must stay under its target, and the last change be "
        "old, before an instance is removed. None: the control plane's default (60000).")


class EngineScalingTargets(ScalingTargets):
    """Targets of an LLM: also the engine's own queue and KV-cache signals."""

    target_waiting: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="Requests waiting in the engine per instance the autoscaler aims for "
        "(vllm:num_requests_waiting, read from each instance's /metrics). None: not a signal.")
    max_kv_cache_usage: float | None = Field(
        default=None, gt=0, le=1,
        description="KV-cache usage per instance to stay under, a fraction in (0, 1] "
        "(vllm:kv_cache_usage_perc). None: not a signal.")
