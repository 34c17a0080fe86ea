"""JSON from a client, parsed without letting it exhaust the stack or smuggle bad text.

`json.loads` recurses once per nesting level: 100,000 `[` would raise a RecursionError deep
in the parser. Here the interpreter's recursion limit is caught, and a configured depth is then
enforced over the parsed value (without recursion), along with text Python accepts but UTF-8
cannot carry: lone UTF-16 surrogates written as `\\ud800` escapes.
"""

from __future__ import annotations

import json
import re
from itertools import chain
from typing import Any

from podium.errors import InvalidArgument

_SCALARS = frozenset({int, float, bool, str, type(None)})
_CONTAINERS = frozenset({list, dict})
# a surrogate can only enter a str through a \\uD800-\\uDFFF escape: valid UTF-8 has none
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def loads_object(raw: bytes | memoryview, *, max_depth: int, flag: str = "--max-json-depth"
                 ) -> dict[str, Any]:
    """A JSON object from `raw`; 400 for invalid JSON, other values, excess depth or a lone
    surrogate, each naming where."""
    raw = bytes(raw)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise InvalidArgument(f"the request body nests JSON deeper than the {max_depth}-level "
                              f"limit ({flag})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"request body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"request body must be a JSON object, got {type_name(data)}")
    check_value(data, max_depth=max_depth, flag=flag,
                check_text=_SURROGATE_ESCAPE.search(raw) is not None)
    return data


def loads_value(text: str, *, field: str, max_depth: int = 64) -> Any:
    """Any JSON value from text a client put inside a field (a parameter holding JSON), with
    the body's checks; the 400 names `field`."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise InvalidArgument(f"{field} nests JSON deeper than {max_depth} levels",
                              param=field) from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{field} is not valid JSON ({exc})", param=field) from None
    if isinstance(data, dict | list):
        check_value(data, max_depth=max_depth, flag=None, root=field)
    return data


def check_value(data: Any, *, max_depth: int, flag: str | None = "--max-json-depth",
                check_text: bool = True, root: str = "body") -> None:
    """Depth at most `max_depth` and every string (keys too) encodable as UTF-8; errors
    name the place from `root` and the limit's `flag`."""
    if not check_text and _within_depth(data, max_depth):
        return
    where = f" ({flag})" if flag else ""
    # (container, depth, path): a path is (parent path, key), built into text only for errors
    stack: list[tuple[Any, int, Any]] = [(data, 1, None)]
    while stack:
        value, depth, path = stack.pop()
        if depth > max_depth:
            raise InvalidArgument(f"JSON at {_path(path, root)} (depth {depth}) nests deeper "
                                  f"than the {max_depth}-level limit{where}", param=root)
        if isinstance(value, list) and _SCALARS.issuperset(map(type, value)):
            if check_text and str in set(map(type, value)):
                for index, item in enumerate(value):
                    if isinstance(item, str):
                        _check_text(item, (path, index), root)
            continue  # a list of scalars (tensor data, mostly): checked without a Python loop
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if check_text and isinstance(key, str):
                _check_text(key, (path, key), root)
            if isinstance(item, dict | list):
                stack.append((item, depth + 1, (path, key)))
            elif check_text and isinstance(item, str):
                _check_text(item, (path, key), root)


def _within_depth(data: Any, max_depth: int) -> bool:
    """Whether `data` nests at most `max_depth` deep, a level at a time: its scalars are
    looked at in C (`chain`, `map`), never one by one in Python."""
    level = [data]
    for _ in range(max_depth):
        items = list(chain.from_iterable(c.values() if type(c) is dict else c for c in level))
        kinds = set(map(type, items))
        if list not in kinds and dict not in kinds:
            return True
        level = items if kinds <= _CONTAINERS else [x for x in items if type(x) in _CONTAINERS]
    return False


def _check_text(text: str, path: Any, root: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start:exc.end].encode("unicode_escape").decode()
        raise InvalidArgument(f"JSON string at {_path(path, root)} holds a lone UTF-16 surrogate "
                              f"({bad}); send valid Unicode text", param=str(path[1])) from None


def _path(path: Any, root: str) -> str:
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    text = root + "".join(reversed(parts))
    return text if len(text) <= 60 else text[:57] + "..."


def type_name(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    return {list: "an array", dict: "an object", type(None): "null", str: "a string",
            bool: "a boolean", int: "a number", float: "a number"}.get(type(value),
                                                                      type(value).__name__)


__all__ = ["check_value", "loads_object", "loads_value", "type_name"]
