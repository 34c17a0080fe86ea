"""LoRA adapters as the control plane sees them: whether an adapter fits a base version.
Pure: the adapter (`podium.package.adapter.adapter_of` of its stored manifest) and the base's
stored manifest in, the reason out.

An adapter deployment has no instances of its own. Its one placement (`num_desired` 1) is on
every instance of its base model's deployment: the world turns a `Scale` of an adapter into a
placement in the gateway's table (`RouteTable.set_adapter`), never into a process, and the
rollout controller moves the split between adapter versions as it does between model versions.
Every base version that runs carries every placed adapter, so a base rollout first checks that
its new version fits them all (`misfit` here, from the manifests; the adapter's tensors against
the new base's weights when it is carried over, `podium.package.adapter_carry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podium.package.adapter import AdapterInfo, adapter_of
from podium.package.lora_manifest import LoraSettings

__all__ = ["AdapterInfo", "adapter_of", "max_lora_rank", "misfit"]


def max_lora_rank(base_manifest: Mapping[str, Any]) -> int:
    """The largest rank a base package's engine takes (its `lora` settings, with defaults)."""
    return LoraSettings.model_validate(base_manifest.get("lora") or {}).max_lora_rank


def misfit(adapter: AdapterInfo, base_version: str,
           base_manifest: Mapping[str, Any]) -> str | None:
    """Why `adapter` cannot run on `base_version` of its base (None: it fits)."""
    where = f"{adapter.base_name}@{base_version}"
    if base_manifest.get("backend") != "vllm" or base_manifest.get("task", "generate") != \
            "generate":
        return f"{where} is not a generative LLM package"
    if not isinstance(base_manifest.get("lora"), Mapping):
        return f"{where} does not enable LoRA adapters (no \"lora\" settings)"
    limit = max_lora_rank(base_manifest)
    if adapter.rank > limit:
        return f"rank {adapter.rank} is above {where}'s max_lora_rank {limit}"
    return None
