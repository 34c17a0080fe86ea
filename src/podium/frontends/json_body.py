"""A JSON request body read within limits: its size sent and inflated, its nesting depth and
the text of every string, each refused with a 4xx naming the limit or the field.

    read_body (--max-body-bytes, 413) → undo gzip/deflate (--max-inflated-bytes, 413)
    → decode UTF-8 → parse (--max-json-depth, 400) → every string valid UTF-8 (400)

Invalid UTF-8 bytes are decoded as lone surrogates (Python's `surrogateescape`), so they and
a JSON `"\\ud800"` escape are found by the same walk, which names the field that holds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from podium.errors import InvalidArgument
from podium.frontends.http_body import DEFAULT_MAX_BODY_BYTES, read_body

DEFAULT_MAX_INFLATED_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_JSON_DEPTH = 64


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
    from podium.gateway.encoding import decoded

    raw = await read_body(request, limits.max_body_bytes)
    raw = decoded(raw, request.headers.get("content-encoding", ""), limits.max_inflated_bytes,
                  server="the instance", flag="--max-inflated-bytes")
    text = raw.decode("utf-8", "surrogateescape")
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
    check_tree(body, limits.max_json_depth)
    return body


def check_tree(body: dict[str, Any], max_depth: int) -> None:
    """400 for nesting deeper than `max_depth`, or a string that is not valid UTF-8 text."""
    stack: list[tuple[Any, str, int]] = [(body, "", 1)]
    while stack:  # a loop, not recursion: the depth is what is being checked
        value, path, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, path or "body")
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > max_depth:
            raise _too_deep(max_depth, path)
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                _check_text(key, child)
                stack.append((item, child, depth + 1))
        else:
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        what = ("bytes that are not UTF-8" if 0xDC80 <= ord(bad) <= 0xDCFF
                else f"a lone UTF-16 surrogate (\\u{ord(bad):04x})")
        shown = _printable(path)
        raise InvalidArgument(f"{shown} is not valid text: it holds {what} at character "
                              f"{exc.start}; send UTF-8 text (surrogates only in pairs)",
                              param=shown) from None


def _printable(path: str) -> str:
    # a key may itself hold the bad bytes: the param names it escaped, as JSON would
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def _too_deep(max_depth: int, path: str = "") -> InvalidArgument:
    where = f" at {path}" if path else ""
    return InvalidArgument(f"the request body nests arrays and objects deeper than "
                           f"{max_depth} levels{where} (--max-json-depth)",
                           param=path or None)


def _json_type(value: Any) -> str:
    return {list: "an array", type(None): "null", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
