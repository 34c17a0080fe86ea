"""What a constraint type is: a name, a spec validator and a compiler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # base loads numba, which must wait for vLLM's worker (docs/constraints.md)
    from podium.constraints.compile.base import Constraint
    from podium.constraints.compile.vocab import TokenizerInfo


@dataclass(frozen=True)
class ConstraintType:
    """A named kind of constraint."""

    name: str
    """The ``type`` requests use, e.g. ``"choice"``."""
    validate: Callable[[dict[str, Any]], dict[str, Any]]
    """Spec (``type`` included) -> normalized spec; raise ``ValueError`` naming the problem."""
    compile: Callable[[dict[str, Any], TokenizerInfo], Constraint]
    """Normalized spec + tokenizer -> compiled constraint (cached by the caller)."""
