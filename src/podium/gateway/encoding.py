"""Undoing a request's Content-Encoding (gzip, deflate) where the gateway must read the body.

Only OpenAI requests need it: they are routed by the JSON body's `model` field. Inflating stops
at the body limit, so a small compressed body that would inflate to gigabytes (a "zip bomb")
costs at most the limit in memory; KServe bodies are routed by their path and forwarded as
they came.
"""

from __future__ import annotations

import zlib

from podium.errors import InvalidArgument, PayloadTooLarge

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
          "deflate": zlib.MAX_WBITS}
"""zlib window bits per coding; `deflate` is the zlib format (RFC 9110 §8.4.1.2)."""


def decoded(body: bytes, content_encoding: str, max_bytes: int, *, server: str = "the gateway",
            flag: str = "--max-body-bytes") -> bytes:
    """`body` with `content_encoding` undone; 413 once it inflates past `max_bytes` (the limit
    `flag` of `server` sets)."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in _WBITS:
        raise InvalidArgument(f"Content-Encoding: {content_encoding} is not one {server} "
                              "reads; send the body uncompressed, gzip or deflate",
                              param="Content-Encoding")
    inflater = zlib.decompressobj(_WBITS[coding])
    try:
        plain = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        if coding == "deflate":  # some clients send raw deflate without the zlib wrapper
            return _raw_deflate(body, max_bytes, exc, server, flag)
        raise _not_valid(coding, exc) from None
    if len(plain) > max_bytes:
        raise _too_large(len(body), coding, max_bytes, server, flag)
    if not inflater.eof:
        raise InvalidArgument(f"the {coding} request body is cut short: it ends before its "
                              "compressed stream does", param="Content-Encoding")
    if inflater.unused_data:
        raise InvalidArgument(f"the {coding} request body has {len(inflater.unused_data)} "
                              "bytes after the end of its compressed stream",
                              param="Content-Encoding")
    return plain


def _raw_deflate(body: bytes, max_bytes: int, first: zlib.error, server: str,
                 flag: str) -> bytes:
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        plain = inflater.decompress(body, max_bytes + 1)
    except zlib.error:
        raise _not_valid("deflate", first) from None
    if len(plain) > max_bytes:
        raise _too_large(len(body), "deflate", max_bytes, server, flag)
    if not inflater.eof or inflater.unused_data:
        raise _not_valid("deflate", first)
    return plain


def _not_valid(coding: str, exc: zlib.error) -> InvalidArgument:
    return InvalidArgument(f"the request body is not valid {coding} ({exc}) though its "
                           f"Content-Encoding says so", param="Content-Encoding")


def _too_large(compressed: int, coding: str, max_bytes: int, server: str,
               flag: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"the {compressed}-byte {coding} request body inflates past "
                           f"{server}'s limit of {max_bytes} bytes ({flag})",
                           param="Content-Encoding")
