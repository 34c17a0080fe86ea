"""Limits of the KServe frontends, and reading an HTTP body within them.

Every limit has a `podium serve` flag (named in the error a client gets past it) and a default
documented in `docs/operations.md`. A body is capped twice: as sent, and once inflated
(`Content-Encoding: gzip | deflate`), where inflation stops at the cap instead of expanding a
bomb into memory.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from podium.errors import InvalidArgument, PayloadTooLarge
from podium.frontends import http_body
from podium.frontends.http_body import DEFAULT_MAX_BODY_BYTES

if TYPE_CHECKING:
    from starlette.requests import Request

DEFAULT_MAX_INFLATED_BYTES = 32 * 1024 * 1024  # shared with OpenAI bodies (json_body)
DEFAULT_MAX_JSON_DEPTH = 64
DEFAULT_MAX_TENSORS = 64
DEFAULT_MAX_ELEMENTS = 16 * 1024 * 1024
DEFAULT_GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# zlib's window bits: 16+ reads a gzip header, a negative value raw deflate (no zlib header)
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_CHUNK = 64 * 1024


class KServeLimits(BaseModel):
    """What one KServe request may hold, over HTTP and gRPC."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024,
                                description="Largest HTTP body as sent (413 past it).")
    max_inflated_bytes: int = Field(default=DEFAULT_MAX_INFLATED_BYTES, ge=1024,
                                    description="Largest HTTP body once gzip/deflate is "
                                    "inflated (413 past it).")
    max_json_depth: int = Field(default=DEFAULT_MAX_JSON_DEPTH, ge=2, le=500,
                                description="Deepest nesting of JSON arrays and objects.")
    max_tensors: int = Field(default=DEFAULT_MAX_TENSORS, ge=1,
                             description="Most inputs, and most requested outputs, per request.")
    max_elements: int = Field(default=DEFAULT_MAX_ELEMENTS, ge=1,
                              description="Most tensor elements per request, all inputs "
                              "together.")
    grpc_max_message_bytes: int = Field(default=DEFAULT_GRPC_MAX_MESSAGE_BYTES, ge=1024,
                                        description="Largest gRPC message received "
                                        "(RESOURCE_EXHAUSTED past it).")


async def read_body(request: Request, limits: KServeLimits) -> bytes:
    """The body, inflated if compressed; 413 past either cap, 400 for an unknown encoding."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity", *_WBITS):
        raise InvalidArgument(f"Content-Encoding {encoding!r} is not supported; use gzip, "
                              "deflate or none", param="Content-Encoding")
    raw = await http_body.read_body(request, limits.max_body_bytes)
    if encoding in _WBITS:
        return inflate(raw, encoding, limits.max_inflated_bytes)
    return raw


def inflate(raw: bytes, encoding: str, max_bytes: int) -> bytes:
    """Inflate gzip or deflate (zlib-wrapped, or raw as some clients send it) up to
    `max_bytes`; one byte more is a 413 rather than a bomb held in memory."""
    try:
        return _inflate(raw, _WBITS[encoding], encoding, max_bytes)
    except zlib.error as exc:
        if encoding != "deflate":
            raise InvalidArgument(f"body is not valid {encoding} ({exc})",
                                  param="Content-Encoding") from None
    try:  # "deflate" without the zlib header, as some clients send it
        return _inflate(raw, -zlib.MAX_WBITS, encoding, max_bytes)
    except zlib.error as exc:
        raise InvalidArgument(f"body is not valid deflate ({exc})",
                              param="Content-Encoding") from None


def _inflate(raw: bytes, wbits: int, encoding: str, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    parts, size, pending = [], 0, memoryview(raw)
    while True:
        part = inflater.decompress(pending, _CHUNK)
        size += len(part)
        if size > max_bytes:
            raise PayloadTooLarge(f"the {encoding} body inflates past the {max_bytes}-byte "
                                  "limit (--max-inflated-bytes)")
        parts.append(part)
        pending = memoryview(inflater.unconsumed_tail)
        if inflater.eof or (not pending and not part):
            break
    parts.append(inflater.flush())
    if size + len(parts[-1]) > max_bytes:
        raise PayloadTooLarge(f"the {encoding} body inflates past the {max_bytes}-byte "
                              "limit (--max-inflated-bytes)")
    if not inflater.eof:
        raise zlib.error("the compressed stream ends early")
    if inflater.unused_data:
        raise zlib.error(f"{len(inflater.unused_data)} bytes follow the compressed stream")
    return b"".join(parts)


__all__ = ["KServeLimits", "inflate", "read_body"]
