"""Constraint types by name: the built-ins plus plugins from the ``podium.constraints`` group.

A constraint type is two functions: ``validate`` turns a request's spec into a normalized
JSON-able dict (raising ``ValueError`` with a message that names the problem), and
``compile`` turns a normalized spec into a :class:`~podium.constraints.base.Constraint`
for a tokenizer. Register one in code with :func:`register_constraint_type`, or ship it in a
package with an entry point::

    [project.entry-points."podium.constraints"]
    even_digits = "my_pkg.constraints:EVEN_DIGITS"   # a ConstraintType

:func:`load_constraint_plugins` loads that group; the server calls it at boot, and the engine
process calls it when it first compiles a constraint (it is a different process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # base loads numba, which must wait for vLLM's worker (docs/constraints.md)
    from podium.constraints.base import Constraint
    from podium.constraints.vocab import TokenizerInfo

ENTRY_POINT_GROUP = "podium.constraints"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConstraintType:
    """A named kind of constraint."""

    name: str
    """The ``type`` requests use, e.g. ``"choice"``."""
    validate: Callable[[dict[str, Any]], dict[str, Any]]
    """Spec (``type`` included) -> normalized spec; raise ``ValueError`` naming the problem."""
    compile: Callable[[dict[str, Any], TokenizerInfo], Constraint]
    """Normalized spec + tokenizer -> compiled constraint (cached by the caller)."""


_TYPES: dict[str, ConstraintType] = {}
_plugins_loaded = False


def register_constraint_type(ct: ConstraintType, *, replace: bool = False) -> None:
    """Make ``ct`` available to requests as ``{"type": ct.name, ...}``."""
    if ct.name in _TYPES and not replace:
        raise ValueError(f"constraint type {ct.name!r} is already registered")
    _TYPES[ct.name] = ct


def constraint_type(name: str) -> ConstraintType | None:
    _ensure_builtins()
    return _TYPES.get(name)


def constraint_type_names() -> list[str]:
    _ensure_builtins()
    return sorted(_TYPES)


def load_constraint_plugins() -> list[str]:
    """Register every ``podium.constraints`` entry point; return the names loaded.

    Idempotent. A plugin that fails to import or is not a ``ConstraintType`` raises, so a
    broken plugin stops boot instead of half-serving.
    """
    global _plugins_loaded
    from importlib.metadata import entry_points

    _ensure_builtins()
    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        ct = obj() if callable(obj) and not isinstance(obj, ConstraintType) else obj
        if not isinstance(ct, ConstraintType):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a ConstraintType")
        register_constraint_type(ct, replace=True)
        names.append(ct.name)
        log.info("loaded constraint plugin %s from %s", ct.name, ep.value)
    _plugins_loaded = True
    return names


def ensure_plugins_loaded() -> None:
    if not _plugins_loaded:
        load_constraint_plugins()


def _ensure_builtins() -> None:
    if "choice" not in _TYPES:
        from podium.constraints.builtins import BUILTIN_TYPES

        for ct in BUILTIN_TYPES:
            _TYPES.setdefault(ct.name, ct)
