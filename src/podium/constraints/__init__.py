"""Constrained decoding: state machines over generated tokens, applied inside vLLM's loop.

Public surface (importing this package loads neither torch nor vLLM):

- :func:`admit_constraint` — admission of a request's ``constraint`` field (both APIs);
- :func:`validate_constraint` — the constraint check alone;
- :func:`to_vllm_xargs` / ``XARGS_KEY`` — how a validated constraint travels to the engine;
- :func:`load_constraint_plugins` — register user-defined types from the
  ``podium.constraints`` entry-point group (call at boot);
- :class:`ConstraintType`, :func:`register_constraint_type` — define a constraint type;
- :class:`Constraint`, :class:`TableConstraint`, :class:`TokenTable` — the state-machine API;
- ``PROCESSOR_FQCN`` / :func:`engine_logits_processors` — the vLLM logits processor, and the
  engine's ``logits_processors`` argument (empty when the entry point is installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from podium.constraints.admission import (
    XARGS_KEY,
    admit_constraint,
    check_sampling,
    to_vllm_xargs,
    validate_constraint,
)
from podium.constraints.registry import (
    ENTRY_POINT_GROUP,
    ConstraintType,
    load_constraint_plugins,
    register_constraint_type,
)

if TYPE_CHECKING:
    from podium.constraints.base import Constraint, TableConstraint
    from podium.constraints.table import TokenTable

PROCESSOR_FQCN = "podium.constraints.processor:ConstraintLogitsProcessor"


def engine_logits_processors() -> list[str]:
    """What to pass as the engine's ``logits_processors``: nothing when the
    ``vllm.logits_processors`` entry point is installed (vLLM loads it already, and would
    otherwise run the processor twice), else the processor's FQCN."""
    from importlib.metadata import entry_points

    installed = {ep.value.replace(" ", "") for ep in entry_points(group="vllm.logits_processors")}
    return [] if PROCESSOR_FQCN in installed else [PROCESSOR_FQCN]

_LAZY = {
    "Constraint": "podium.constraints.base",
    "TableConstraint": "podium.constraints.base",
    "TokenTable": "podium.constraints.table",
    "TokenizerInfo": "podium.constraints.vocab",
}


def __getattr__(name: str) -> Any:
    # numpy-backed classes load on first use, keeping `import podium.constraints` light
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = [
    "ENTRY_POINT_GROUP",
    "PROCESSOR_FQCN",
    "XARGS_KEY",
    "Constraint",
    "ConstraintType",
    "TableConstraint",
    "TokenTable",
    "TokenizerInfo",
    "admit_constraint",
    "check_sampling",
    "engine_logits_processors",
    "load_constraint_plugins",
    "register_constraint_type",
    "to_vllm_xargs",
    "validate_constraint",
]
