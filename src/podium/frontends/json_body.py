"""An OpenAI request's JSON body read within limits: its size sent and inflated, its nesting
depth and the text of every string, each refused with a 4xx naming the limit or the field.

    read_body (--max-body-bytes, 413) → undo gzip/deflate (--max-inflated-bytes, 413)
    → decode UTF-8 → parse (--max-json-depth, 400) → every string valid UTF-8 (400)

Each step is the edge's (`podium.edge`); the wording is the OpenAI routes'. Invalid UTF-8
bytes are decoded as lone surrogates (Python's `surrogateescape`), so they and a JSON
`"\\ud800"` escape are found by the same walk, which names the field that holds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from podium.edge.body import DEFAULT_MAX_BODY_BYTES, read_request_body
from podium.edge.inflate import DEFAULT_MAX_INFLATED_BYTES, InflateWording, inflate
from podium.edge.json_checks import (
    DEFAULT_MAX_JSON_DEPTH,
    JsonIssue,
    find_issue,
    may_hold_surrogates,
)
from podium.errors import InvalidArgument

_INFLATE = InflateWording(server="the instance", flag="--max-inflated-bytes")


@dataclass(frozen=True)
class BodyLimits:
    """How much of a JSON body the instance reads."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Bytes on the wire (compressed or not)."""
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    """Bytes a gzip or deflate body may inflate to."""
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    """Nesting of arrays and objects."""


async def read_json_object(request: Request, limits: BodyLimits) -> dict[str, Any]:
    """The body as a JSON object within `limits`, or a 4xx naming what is wrong."""
    raw = await read_request_body(request.scope, request.receive, limits.max_body_bytes)
    raw = inflate(raw, request.headers.get("content-encoding", ""), limits.max_inflated_bytes,
                  _INFLATE)
    try:
        text, check_text = raw.decode("utf-8"), may_hold_surrogates(raw)
    except UnicodeDecodeError:  # the bad bytes become lone surrogates the walk names
        text, check_text = raw.decode("utf-8", "surrogateescape"), True
    if not text.strip():
        raise InvalidArgument("the request body is empty; send a JSON object")
    try:
        body = json.loads(text)
    except RecursionError:
        raise _too_deep(limits.max_json_depth) from None
    except ValueError as exc:
        raise InvalidArgument(f"the request body is not valid JSON ({exc}); send a JSON "
                              "object with Content-Type: application/json") from None
    if not isinstance(body, dict):
        raise InvalidArgument(f"the request body must be a JSON object, got "
                              f"{_json_type(body)}")
    check_tree(body, limits.max_json_depth, check_text=check_text)
    return body


def check_tree(body: dict[str, Any], max_depth: int, *, check_text: bool = True) -> None:
    """400 for nesting deeper than `max_depth`, or (with `check_text`) a string that is not
    valid UTF-8 text."""
    issue = find_issue(body, max_depth=max_depth, check_text=check_text)
    if issue is None:
        return
    path = issue.place(root=None)
    if issue.kind == "depth":
        raise _too_deep(max_depth, path)
    _refuse_text(issue, path or "body")


def _refuse_text(issue: JsonIssue, path: str) -> None:
    bad = ord(issue.bad[0])
    what = ("bytes that are not UTF-8" if 0xDC80 <= bad <= 0xDCFF
            else f"a lone UTF-16 surrogate (\\u{bad:04x})")
    # a key may itself hold the bad bytes: the param names it escaped, as JSON would
    shown = path.encode("utf-8", "backslashreplace").decode("utf-8")
    raise InvalidArgument(f"{shown} is not valid text: it holds {what} at character "
                          f"{issue.index}; send UTF-8 text (surrogates only in pairs)",
                          param=shown)


def _too_deep(max_depth: int, path: str = "") -> InvalidArgument:
    where = f" at {path}" if path else ""
    return InvalidArgument(f"the request body nests arrays and objects deeper than "
                           f"{max_depth} levels{where} (--max-json-depth)",
                           param=path or None)


def _json_type(value: Any) -> str:
    return {list: "an array", type(None): "null", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
