"""Readable one-line descriptions of pydantic validation errors, shared by every edge."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError


def describe(exc: ValidationError, *, skip: Iterable[str] = ()) -> str:
    """`field.path: problem (got value)` for each error, joined with '; '."""
    skip = set(skip)
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if str(p) not in skip)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "is not a known field; remove it"
        elif err["type"] == "missing":
            msg = "is required"
        got = "" if err["type"] in ("missing", "extra_forbidden") else f" (got {_short(err)})"
        lines.append(f"{loc or 'body'}: {msg}{got}")
    return "; ".join(lines)


def first_field(exc: ValidationError, *, skip: Iterable[str] = ()) -> str | None:
    skip = set(skip)
    for err in exc.errors():
        return ".".join(str(p) for p in err["loc"] if str(p) not in skip) or None
    return None


def _short(err: Any) -> str:
    text = repr(err.get("input"))
    return text if len(text) <= 80 else text[:77] + "..."
