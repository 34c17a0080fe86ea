"""Reading a JSON request body: size-capped, and a 4xx that names the problem otherwise."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from podium.errors import InvalidArgument, PayloadTooLarge

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body, refusing more than `max_bytes` (declared or actually sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {max_bytes}-byte "
                              "limit (--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds the {max_bytes}-byte limit "
                                  "(--max-body-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; non-JSON, lists, null and scalars are rejected."""
    raw = await read_body(request, max_bytes)
    if not raw.strip():
        raise InvalidArgument("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise InvalidArgument("the request body nests JSON too deeply; flatten it") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"the request body is not valid JSON ({exc}); send a JSON "
                              "object with Content-Type: application/json") from None
    if not isinstance(body, dict):
        raise InvalidArgument(f"the request body must be a JSON object, got "
                              f"{_json_type(body)}")
    return body


def _json_type(value: Any) -> str:
    return {list: "an array", type(None): "null", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
