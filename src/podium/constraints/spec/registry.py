"""Constraint types by name: the built-ins plus plugins from the ``podium.constraints`` group.

A constraint type is two functions: ``validate`` turns a request's spec into a normalized
JSON-able dict (raising ``ValueError`` with a message that names the problem), and
``compile`` turns a normalized spec into a :class:`~podium.constraints.compile.base.Constraint`
for a tokenizer. Register one in code with :func:`register_constraint_type`, or ship it in a
package with an entry point::

    [project.entry-points."podium.constraints"]
    even_digits = "my_pkg.constraints:EVEN_DIGITS"   # a ConstraintType

:func:`load_constraint_plugins` loads that group; the server calls it at boot, and the engine
process calls it when it first compiles a constraint (it is a different process).
"""

from __future__ import annotations

import logging

from podium.constraints.spec.builtins import BUILTIN_TYPES
from podium.constraints.spec.types import ConstraintType

ENTRY_POINT_GROUP = "podium.constraints"
log = logging.getLogger(__name__)

_BUILTINS = {ct.name: ct for ct in BUILTIN_TYPES}
# the built-ins are there from import on, whatever registers (or fails to) after them
_TYPES: dict[str, ConstraintType] = dict(_BUILTINS)
_plugins_loaded = False


def register_constraint_type(ct: ConstraintType, *, replace: bool = False) -> None:
    """Make ``ct`` available to requests as ``{"type": ct.name, ...}``.

    A built-in name is never taken over; ``replace`` lets a type replace an earlier
    registration of its name (plugins reload that way)."""
    if ct.name in _BUILTINS and ct is not _BUILTINS[ct.name]:
        raise ValueError(f"constraint type {ct.name!r} is built in; give yours another name "
                         f"(built in: {', '.join(sorted(_BUILTINS))})")
    if ct.name in _TYPES and not replace and ct is not _TYPES[ct.name]:
        raise ValueError(f"constraint type {ct.name!r} is already registered")
    _TYPES[ct.name] = ct


def constraint_type(name: str) -> ConstraintType | None:
    """The type registered as ``name``, if any."""
    return _TYPES.get(name)


def constraint_type_names() -> list[str]:
    """Every registered name, sorted."""
    return sorted(_TYPES)


def load_constraint_plugins() -> list[str]:
    """Register every ``podium.constraints`` entry point; return the names loaded.

    Idempotent. A plugin that fails to import, is not a ``ConstraintType`` or takes a
    built-in's name raises, so a broken plugin stops boot instead of half-serving.
    """
    global _plugins_loaded
    from importlib.metadata import entry_points

    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        ct = obj() if callable(obj) and not isinstance(obj, ConstraintType) else obj
        if not isinstance(ct, ConstraintType):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a ConstraintType")
        try:
            register_constraint_type(ct, replace=True)
        except ValueError as exc:
            raise ValueError(f"entry point {ep.name} = {ep.value}: {exc}") from None
        names.append(ct.name)
        log.info("loaded constraint plugin %s from %s", ct.name, ep.value)
    _plugins_loaded = True
    return names


def ensure_plugins_loaded() -> None:
    """Load the plugins once per process (the engine process is another one)."""
    if not _plugins_loaded:
        load_constraint_plugins()


__all__ = ["ENTRY_POINT_GROUP", "ConstraintType", "constraint_type", "constraint_type_names",
           "ensure_plugins_loaded", "load_constraint_plugins", "register_constraint_type"]
