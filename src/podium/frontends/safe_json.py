"""JSON from a KServe client, parsed without letting it exhaust the stack or smuggle bad text.

`json.loads` recurses once per nesting level: 100,000 `[` would raise a RecursionError deep
in the parser. Here the interpreter's recursion limit is caught, and the edge's checks
(`podium.edge.json_checks`: depth, lone UTF-16 surrogates written as `\\ud800` escapes) then
run over the parsed value; the errors are worded as KServe clients read them.
"""

from __future__ import annotations

import json
from typing import Any

from podium.edge.json_checks import JsonIssue, find_issue, may_hold_surrogates
from podium.errors import InvalidArgument


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
    check_value(data, max_depth=max_depth, flag=flag, check_text=may_hold_surrogates(raw))
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
    issue = find_issue(data, max_depth=max_depth, check_text=check_text)
    if issue is None:
        return
    if issue.kind == "depth":
        where = f" ({flag})" if flag else ""
        raise InvalidArgument(f"JSON at {_place(issue, root)} (depth {issue.depth}) nests "
                              f"deeper than the {max_depth}-level limit{where}", param=root)
    bad = issue.bad.encode("unicode_escape").decode()
    raise InvalidArgument(f"JSON string at {_place(issue, root)} holds a lone UTF-16 surrogate "
                          f"({bad}); send valid Unicode text", param=str(issue.path[-1]))


def _place(issue: JsonIssue, root: str) -> str:
    text = issue.place(root)
    return text if len(text) <= 60 else text[:57] + "..."


def type_name(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    return {list: "an array", dict: "an object", type(None): "null", str: "a string",
            bool: "a boolean", int: "a number", float: "a number"}.get(type(value),
                                                                      type(value).__name__)


__all__ = ["check_value", "loads_object", "loads_value", "type_name"]
