"""Plugins loaded at boot through Python entry points.

Groups (documented in docs/plugins.md):
- `podium.plugins`: callables run once at boot, before models load (register anything).
- `podium.constraints`: user-defined constraint types for constrained decoding.
- `vllm.logits_processors` / `vllm.general_plugins`: vLLM's own groups, loaded by the engine.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from podium.errors import BootError

log = logging.getLogger("podium.plugins")
PLUGIN_GROUP = "podium.plugins"


def load_plugins() -> list[str]:
    """Run every `podium.plugins` entry point and load user constraint types; names loaded."""
    loaded = []
    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            plugin = ep.load()
            if callable(plugin):
                plugin()
        except Exception as exc:
            raise BootError(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
        loaded.append(f"{PLUGIN_GROUP}:{ep.name}")
    loaded += _load_constraint_plugins()
    for name in loaded:
        log.info("loaded plugin %s", name)
    return loaded


def _load_constraint_plugins() -> list[str]:
    from podium.constraints import load_constraint_plugins

    return [f"podium.constraints:{name}" for name in load_constraint_plugins()]
