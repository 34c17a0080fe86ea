"""LoRA adapters as the control plane sees them: which packages are adapters, of which base,
and whether an adapter fits a base version. Pure: manifests (and the adapter's PEFT config)
in, answers out.

An adapter deployment has no instances of its own. Its one placement (`num_desired` 1) is on
every instance of its base model's deployment: the world turns a `Scale` of an adapter into a
placement in the gateway's table (`RouteTable.set_adapter`), never into a process, and the
rollout controller moves the split between adapter versions as it does between model versions.
Every base version that runs carries every placed adapter, so a base rollout first checks that
its new version fits them all (`misfits`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BACKEND = "lora"
"""The manifest `backend` of an adapter package."""
DEFAULT_MAX_LORA_RANK = 16
"""vLLM's `max_lora_rank` when a base package does not set it."""


@dataclass(frozen=True)
class AdapterRef:
    """What an adapter package says about its base."""

    base: str
    """The base model's name."""
    base_version: str
    """The base version the adapter was trained on."""
    rank: int | None = None
    """LoRA rank `r` (None: unknown)."""
    target_modules: tuple[str, ...] = ()
    """Modules the adapter changes (empty: unknown)."""

    @property
    def base_key(self) -> str:
        """`base@version`, as the manifest names it."""
        return f"{self.base}@{self.base_version}"


def adapter_of(manifest: Mapping[str, Any],
               peft_config: Mapping[str, Any] | None = None) -> AdapterRef | None:
    """The adapter a manifest describes (None: not an adapter package).

    Reads the manifest's `base` (`name@version`) and `rank`, else PEFT's `adapter_config.json`
    `r`; `target_modules` from the latter. (`podium.package.adapter.adapter_of` reads the same
    manifest fields on the instance side.)
    """
    if manifest.get("backend") != BACKEND:
        return None
    base, _, version = str(manifest.get("base") or "").partition("@")
    peft = {**(peft_config or {}), **{k: manifest[k] for k in ("r", "rank", "target_modules")
                                      if k in manifest}}
    rank = peft.get("rank", peft.get("r"))
    modules = peft.get("target_modules") or ()
    return AdapterRef(base=base, base_version=version or "1",
                      rank=rank if isinstance(rank, int) else None,
                      target_modules=tuple(modules) if isinstance(modules, list | tuple)
                      else ())


def read_adapter(manifest: Mapping[str, Any], location: str) -> AdapterRef | None:
    """`adapter_of` with the package's own `adapter_config.json` (when it is readable)."""
    if manifest.get("backend") != BACKEND:
        return None
    try:
        folder = Path(location) / str(manifest.get("path") or ".")
        peft = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError):
        peft = None
    return adapter_of(manifest, peft if isinstance(peft, dict) else None)


def max_lora_rank(base_manifest: Mapping[str, Any]) -> int:
    """The largest rank a base package's engine takes (its `lora` settings, else vLLM's)."""
    lora = base_manifest.get("lora")
    value = lora.get("max_lora_rank") if isinstance(lora, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) \
        else DEFAULT_MAX_LORA_RANK


def misfit(adapter: AdapterRef, base_version: str,
           base_manifest: Mapping[str, Any]) -> str | None:
    """Why `adapter` cannot run on `base_version` of its base (None: it fits)."""
    where = f"{adapter.base}@{base_version}"
    if base_manifest.get("backend") != "vllm" or base_manifest.get("task", "generate") != \
            "generate":
        return f"{where} is not a generative LLM package"
    if not isinstance(base_manifest.get("lora"), Mapping):
        return f"{where} does not enable LoRA adapters (no \"lora\" settings)"
    limit = max_lora_rank(base_manifest)
    if adapter.rank is not None and adapter.rank > limit:
        return f"rank {adapter.rank} is above {where}'s max_lora_rank {limit}"
    return None
