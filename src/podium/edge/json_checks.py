"""Checks on JSON a client sent, after `json.loads`: nesting depth, and text UTF-8 can carry.

`json.loads` recurses once per nesting level, so a surface parses under a `RecursionError`
guard, then walks the value here without recursion: depth at most a limit, and no lone UTF-16
surrogate (a `\\ud800` escape, or a byte that is not UTF-8 decoded with `surrogateescape`) in
any string or key. The walk returns the first `JsonIssue`, and the surface words it: the KServe,
OpenAI and control API errors each name the place their own way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any, Literal

_SCALARS = frozenset({int, float, bool, str, type(None)})
_CONTAINERS = frozenset({list, dict})
# a surrogate can only enter a str through a \\uD800-\\uDFFF escape: valid UTF-8 has none
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

Path = tuple[str | int, ...]

DEFAULT_MAX_JSON_DEPTH = 64
"""The instance's default nesting limit for a JSON body (OpenAI and KServe alike)."""


@dataclass(frozen=True)
class JsonIssue:
    """Where a JSON value breaks a check: a container nested past the limit, or a string (or
    key) holding a character UTF-8 cannot encode."""

    kind: Literal["depth", "text"]
    path: Path
    """Keys and indices from the root to the container or string."""
    depth: int = 0
    """For "depth": the container's depth (the root is 1)."""
    text: str = ""
    """For "text": the string holding the bad character."""
    index: int = 0
    """For "text": the first bad character's position in `text`."""
    end: int = 0
    """For "text": the end of the run of bad characters that starts at `index`."""

    @property
    def bad(self) -> str:
        """For "text": the run of bad characters."""
        return self.text[self.index:self.end]

    def place(self, root: str | None = "body") -> str:
        """The path as `root.key[0]`, or `key[0]` (no root)."""
        parts = [f"[{key}]" if isinstance(key, int) else f".{key}" for key in self.path]
        text = (root or "") + "".join(parts)
        return text[1:] if root is None and text.startswith(".") else text


def may_hold_surrogates(raw: bytes) -> bool:
    """Whether JSON bytes can parse to a string UTF-8 cannot carry: only through an escape
    (UTF-8 bytes decoded strictly hold no surrogate)."""
    return _SURROGATE_ESCAPE.search(raw) is not None


def find_issue(data: Any, *, max_depth: int, check_text: bool = True) -> JsonIssue | None:
    """The first place `data` nests past `max_depth` or (with `check_text`) holds a string
    that is not valid Unicode text; None when there is none."""
    if not check_text and depth_of(data, stop_past=max_depth) <= max_depth:
        return None
    # (container, depth, path): a path is (parent path, key), made a tuple only for an issue
    stack: list[tuple[Any, int, Any]] = [(data, 1, None)]
    while stack:
        value, depth, path = stack.pop()
        if depth > max_depth:
            return JsonIssue("depth", _tuple(path), depth=depth)
        if isinstance(value, list) and _SCALARS.issuperset(map(type, value)):
            if check_text and str in set(map(type, value)):
                for index, item in enumerate(value):
                    if isinstance(item, str) and (issue := _text((path, index), item)):
                        return issue
            continue  # a list of scalars (tensor data, mostly): checked without a Python loop
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if check_text and isinstance(key, str) and (issue := _text((path, key), key)):
                return issue
            if isinstance(item, dict | list):
                stack.append((item, depth + 1, (path, key)))
            elif check_text and isinstance(item, str) and (issue := _text((path, key), item)):
                return issue
    return None


def depth_of(data: Any, *, stop_past: int | None = None) -> int:
    """How deep arrays and objects nest in `data` (0 for a scalar), counted a level at a time
    with the scalars looked at in C, never one by one in Python; counting stops one level
    past `stop_past`."""
    depth = 0
    for _ in _levels(data):
        depth += 1
        if stop_past is not None and depth > stop_past:
            break
    return depth


def _levels(data: Any) -> Iterator[list[Any]]:
    level = [data] if type(data) in _CONTAINERS else []
    while level:
        yield level
        items = list(chain.from_iterable(c.values() if type(c) is dict else c for c in level))
        kinds = set(map(type, items))
        if list not in kinds and dict not in kinds:
            return  # only scalars below: never filtered one by one in Python
        level = items if kinds <= _CONTAINERS else [x for x in items if type(x) in _CONTAINERS]


def _text(path: Any, text: str) -> JsonIssue | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return JsonIssue("text", _tuple(path), text=text, index=exc.start, end=exc.end)
    return None


def _tuple(path: Any) -> Path:
    keys: list[str | int] = []
    while path is not None:
        path, key = path
        keys.append(key)
    return tuple(reversed(keys))
