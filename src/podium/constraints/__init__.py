"""Constrained decoding: state machines over generated tokens, applied inside vLLM's loop.

Three parts, each depending only on the ones before it: ``spec`` (what a constraint is:
types, registry, built-in validation, admission), ``compile`` (spec -> compiled form, off the
engine step), ``engine`` (the batch logits processor vLLM loads); beneath them ``kernels``, the
one set of compiled loops. docs/constraints.md draws them.

Public surface (importing this package loads neither torch nor vLLM):

- :func:`admit_constraint` — admission of a request's ``constraint`` field (both APIs);
- :func:`validate_constraint` — the constraint check alone;
- :func:`to_vllm_xargs` / ``XARGS_KEY`` — how a validated constraint travels to the engine;
- :func:`load_constraint_plugins` — register user-defined types from the
  ``podium.constraints`` entry-point group (call at boot);
- :class:`ConstraintType`, :func:`register_constraint_type` — define a constraint type;
- :class:`Constraint`, :class:`TableConstraint`, :class:`TokenTable` — the state-machine API;
- :func:`precompile_xargs`, :func:`precompiler_for` — compile an admitted constraint before it
  reaches the engine (``KEY_XARGS`` names its form);
- ``PROCESSOR_FQCN`` / :func:`engine_logits_processors` — the vLLM logits processor, and the
  engine's ``logits_processors`` argument (empty when the entry point is installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from podium.constraints.spec.admission import (
    XARGS_KEY,
    admit_constraint,
    check_sampling,
    to_vllm_xargs,
    validate_constraint,
)
from podium.constraints.spec.registry import (
    ENTRY_POINT_GROUP,
    ConstraintType,
    load_constraint_plugins,
    register_constraint_type,
)

if TYPE_CHECKING:
    from podium.constraints.compile.base import Constraint, FormConstraint, TableConstraint
    from podium.constraints.compile.precompile import (
        KEY_XARGS,
        ConstraintPrecompiler,
        Precompiled,
        precompile_xargs,
        precompiler_for,
    )
    from podium.constraints.compile.table import TokenTable
    from podium.constraints.compile.vocab import TokenizerInfo

PROCESSOR_FQCN = "podium.constraints.processor:ConstraintLogitsProcessor"
"""The entry point's value (pyproject.toml); that module re-exports ``engine.processor``."""


def engine_logits_processors() -> list[str]:
    """What to pass as the engine's ``logits_processors``: nothing when the
    ``vllm.logits_processors`` entry point is installed (vLLM loads it already, and would
    otherwise run the processor twice), else the processor's FQCN."""
    from importlib.metadata import entry_points

    installed = {ep.value.replace(" ", "") for ep in entry_points(group="vllm.logits_processors")}
    return [] if PROCESSOR_FQCN in installed else [PROCESSOR_FQCN]

_LAZY = {
    "Constraint": "podium.constraints.compile.base",
    "FormConstraint": "podium.constraints.compile.base",
    "TableConstraint": "podium.constraints.compile.base",
    "TokenTable": "podium.constraints.compile.table",
    "TokenizerInfo": "podium.constraints.compile.vocab",
    "KEY_XARGS": "podium.constraints.compile.precompile",
    "ConstraintPrecompiler": "podium.constraints.compile.precompile",
    "Precompiled": "podium.constraints.compile.precompile",
    "precompile_xargs": "podium.constraints.compile.precompile",
    "precompiler_for": "podium.constraints.compile.precompile",
}


def __getattr__(name: str) -> Any:
    # numpy-backed classes and the compile pool load on first use, keeping
    # `import podium.constraints` light
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = [
    "ENTRY_POINT_GROUP",
    "KEY_XARGS",
    "PROCESSOR_FQCN",
    "XARGS_KEY",
    "Constraint",
    "ConstraintPrecompiler",
    "ConstraintType",
    "FormConstraint",
    "Precompiled",
    "TableConstraint",
    "TokenTable",
    "TokenizerInfo",
    "admit_constraint",
    "check_sampling",
    "engine_logits_processors",
    "load_constraint_plugins",
    "precompile_xargs",
    "precompiler_for",
    "register_constraint_type",
    "to_vllm_xargs",
    "validate_constraint",
]
