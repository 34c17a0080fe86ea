"""References between steps: `$input.member_id`, `$cands.items`, `$rank.scores|$pick.titles`.

A string value in a step's settings that starts with `$` is a reference: `$input.NAME` reads a
request input, `$STEP` a step's whole result and `$STEP.a.0.b` a path inside it (dict keys,
list indices). `a|b` takes the first alternative that is not null (a step skipped for another
variant is null). `$$` escapes a literal dollar.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from podium.errors import InvalidArgument

INPUT = "input"
_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$|^\d+$")


@dataclass(frozen=True)
class Ref:
    """One alternative of a reference: a root (`input` or a step) and a path inside it."""

    root: str
    path: tuple[str, ...]


def parse(text: str) -> list[Ref] | None:
    """The alternatives of a reference, or None when `text` is a literal."""
    if not text.startswith("$") or text.startswith("$$"):
        return None
    alternatives = []
    for part in text.split("|"):
        part = part.strip()
        if not part.startswith("$") or len(part) < 2:
            raise ValueError(f"{text!r}: every alternative starts with `$` (e.g. `$step.field`)")
        names = part[1:].split(".")
        if not all(_PART.match(name) for name in names):
            raise ValueError(f"{text!r}: `{part}` is not `$step` or `$step.field.path`")
        alternatives.append(Ref(names[0], tuple(names[1:])))
    return alternatives


@lru_cache(maxsize=4096)
def _parsed(text: str) -> tuple[Ref, ...] | None:
    """`parse`, once per distinct string: a pipeline's settings resolve every request."""
    refs = parse(text)
    return None if refs is None else tuple(refs)


def walk(value: Any) -> Iterator[list[Ref]]:
    """Every reference in a settings value (nested dicts and lists)."""
    if isinstance(value, str):
        refs = parse(value)
        if refs is not None:
            yield refs
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from walk(item)


def resolve(value: Any, scope: Mapping[str, Any]) -> Any:
    """`value` with every reference replaced by what it points at in `scope` (the request
    inputs under `input`, each finished step's result under its name)."""
    if isinstance(value, str):
        refs = _parsed(value)
        if refs is None:
            return value[1:] if value.startswith("$$") else value
        for ref in refs:
            found = _lookup(ref, scope, value)
            if found is not None:
                return found
        return None
    if isinstance(value, Mapping):
        return {key: resolve(item, scope) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(item, scope) for item in value]
    return value


def _lookup(ref: Ref, scope: Mapping[str, Any], text: str) -> Any:
    current = scope.get(ref.root)
    for name in ref.path:
        if current is None:
            return None
        if isinstance(current, Mapping):
            current = current.get(name)
        elif isinstance(current, list | tuple) and name.isdigit():
            index = int(name)
            current = current[index] if index < len(current) else None
        else:
            raise InvalidArgument(f"reference {text!r}: `{name}` cannot be read from a "
                                  f"{type(current).__name__}")
    return current
