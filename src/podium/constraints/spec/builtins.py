"""Validation and compilation of the built-in constraint types."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from podium.constraints.spec.types import ConstraintType

if TYPE_CHECKING:  # base loads numba, which must wait for vLLM's worker (docs/constraints.md)
    from podium.constraints.compile.base import Constraint
    from podium.constraints.compile.vocab import TokenizerInfo

MAX_CHOICES = 100_000
MAX_PATTERN_CHARS = 10_000


def _fields(spec: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(spec) - allowed - {"type"})
    if extra:
        raise ValueError(f"unknown field {extra[0]!r}; {spec['type']} takes "
                         f"{', '.join(sorted(allowed))}", extra[0])


def _strings(spec: dict[str, Any], key: str) -> list[str]:
    value = spec.get(key)
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list of strings, got {type(value).__name__}", key)
    if not value:
        raise ValueError(f"{key} is empty: give at least one string", key)
    if len(value) > MAX_CHOICES:
        raise ValueError(f"{key} has {len(value)} strings; at most {MAX_CHOICES}", key)
    for i, s in enumerate(value):
        if not isinstance(s, str):
            raise ValueError(f"{key}[{i}] must be a string, got {type(s).__name__}",
                             f"{key}[{i}]")
        if not s:
            raise ValueError(f"{key}[{i}] is the empty string", f"{key}[{i}]")
    return list(dict.fromkeys(value))  # duplicates add nothing; keep first-seen order


def _int(spec: dict[str, Any], key: str, default: int) -> int:
    value = spec.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer, got {value!r}", key)
    if value < 0:
        raise ValueError(f"{key}={value} is negative", key)
    return value


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def validate_choice(spec: dict[str, Any]) -> dict[str, Any]:
    _fields(spec, {"choices"})
    choices = _strings(spec, "choices")
    for i, s in enumerate(choices):
        # tokenizers drop some control characters, so the model could never write them
        m = _CONTROL.search(s)
        if m:
            raise ValueError(f"choices[{i}] contains control character "
                             f"U+{ord(m.group()):04X}; remove it", f"choices[{i}]")
    return {"type": "choice", "choices": choices}


def validate_distinct_items(spec: dict[str, Any]) -> dict[str, Any]:
    _fields(spec, {"items", "min", "max"})
    items = _strings(spec, "items")
    lo = _int(spec, "min", 1)
    hi = _int(spec, "max", len(items))
    if lo > len(items):
        raise ValueError(f"min={lo} exceeds the {len(items)} distinct items", "min")
    if lo > hi:
        raise ValueError(f"min={lo} is greater than max={hi}", "min")
    if hi == 0:
        raise ValueError("max=0 allows only the empty array; ask for at least one item", "max")
    return {"type": "distinct_items", "items": items, "min": lo, "max": min(hi, len(items))}


def validate_regex(spec: dict[str, Any]) -> dict[str, Any]:
    _fields(spec, {"pattern"})
    pattern = spec.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("pattern must be a non-empty string", "pattern")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"pattern has {len(pattern)} characters; at most "
                         f"{MAX_PATTERN_CHARS}", "pattern")
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regex {pattern!r}: {e}", "pattern") from None
    except RecursionError:
        raise ValueError("regex groups are nested too deeply; flatten the pattern",
                         "pattern") from None
    import interegular

    # parsed only: admission runs on the event loop, and building the DFA may take seconds
    # (bounded in podium.constraints.compile.regex, which the compile does off the loop)
    try:
        # the DFA builder supports a subset of Python regex (no lookarounds, backrefs)
        interegular.parse_pattern(pattern)
    except Exception as e:
        raise ValueError(f"regex {pattern!r} cannot be compiled to a DFA: {e}",
                         "pattern") from None
    return {"type": "regex", "pattern": pattern}


def _compile_choice(spec: dict[str, Any], tok: TokenizerInfo) -> Constraint:
    from podium.constraints.compile.choice import ChoiceConstraint

    return ChoiceConstraint(spec["choices"], tok)


def _compile_distinct(spec: dict[str, Any], tok: TokenizerInfo) -> Constraint:
    from podium.constraints.compile.distinct import DistinctItemsConstraint

    return DistinctItemsConstraint(spec["items"], spec["min"], spec["max"], tok)


def _compile_regex(spec: dict[str, Any], tok: TokenizerInfo) -> Constraint:
    from podium.constraints.compile.regex import RegexConstraint
    from podium.errors import InvalidArgument

    try:
        return RegexConstraint(spec["pattern"], tok)
    except Exception as exc:  # a pattern matching nothing, one past the bounds of
        # podium.constraints.compile.regex, a construct the parser took but the DFA cannot hold
        raise InvalidArgument(f"constraint (regex) cannot be compiled: {exc}",
                              param="constraint.pattern") from None


BUILTIN_TYPES = (
    ConstraintType("choice", validate_choice, _compile_choice),
    ConstraintType("distinct_items", validate_distinct_items, _compile_distinct),
    ConstraintType("regex", validate_regex, _compile_regex),
)
