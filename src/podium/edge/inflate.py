"""A gzip or deflate request body inflated in memory, never past a byte cap.

A small compressed body can inflate to gigabytes (a "zip bomb"): inflation asks zlib for at
most one byte more than the cap, so the bomb costs at most the cap in memory before it is
refused. `deflate` is the zlib format (RFC 9110 §8.4.1.2); some clients send raw deflate
without the zlib wrapper, which is read too. What a refusal says is the surface's
(`InflateWording`); the defaults are the gateway's and the instance's OpenAI routes'.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from podium.errors import InvalidArgument, PayloadTooLarge, PodiumError

DEFAULT_MAX_INFLATED_BYTES = 32 * 1024 * 1024
"""The instance's default for a gzip/deflate body once inflated (OpenAI and KServe alike)."""

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
          "deflate": zlib.MAX_WBITS}
"""zlib window bits per coding: 16+ reads a gzip header, a negative value raw deflate."""


@dataclass(frozen=True)
class InflateWording:
    """What a refused compressed body says, naming `server`'s limit and its `flag`."""

    server: str = "the gateway"
    flag: str = "--max-body-bytes"
    codings: frozenset[str] = frozenset(_WBITS)
    """The Content-Encodings read (besides none and identity)."""

    def unknown(self, coding: str) -> PodiumError:
        """A Content-Encoding not in `codings`."""
        return InvalidArgument(f"Content-Encoding: {coding} is not one {self.server} reads; "
                               "send the body uncompressed, gzip or deflate",
                               param="Content-Encoding")

    def too_large(self, compressed: int, coding: str, max_bytes: int) -> PodiumError:
        """The `compressed`-byte body inflates past `max_bytes`."""
        return PayloadTooLarge(f"the {compressed}-byte {coding} request body inflates past "
                               f"{self.server}'s limit of {max_bytes} bytes ({self.flag})",
                               param="Content-Encoding")

    def corrupt(self, coding: str, detail: str) -> PodiumError:
        """zlib could not read the body."""
        return InvalidArgument(f"the request body is not valid {coding} ({detail}) though its "
                               "Content-Encoding says so", param="Content-Encoding")

    def truncated(self, coding: str) -> PodiumError:
        """The body ends before its compressed stream does."""
        return InvalidArgument(f"the {coding} request body is cut short: it ends before its "
                               "compressed stream does", param="Content-Encoding")

    def trailing(self, coding: str, num_bytes: int) -> PodiumError:
        """`num_bytes` follow the end of the compressed stream."""
        return InvalidArgument(f"the {coding} request body has {num_bytes} bytes after the "
                               "end of its compressed stream", param="Content-Encoding")


GATEWAY = InflateWording()


def check_coding(content_encoding: str, wording: InflateWording = GATEWAY) -> str:
    """The coding named by a Content-Encoding header, lower-cased ("" for none or
    identity); refused when `wording` does not read it."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return ""
    if coding not in wording.codings or coding not in _WBITS:
        raise wording.unknown(coding)
    return coding


def inflate(body: bytes, content_encoding: str, max_bytes: int,
            wording: InflateWording = GATEWAY) -> bytes:
    """`body` with `content_encoding` undone (as it is when none); refused once it inflates
    past `max_bytes`, or when it is not what its Content-Encoding says."""
    coding = check_coding(content_encoding, wording)
    if not coding:
        return body
    try:
        return _inflate(body, _WBITS[coding], coding, max_bytes, wording)
    except zlib.error as exc:
        if coding != "deflate":
            raise wording.corrupt(coding, str(exc)) from None
        first = exc
    try:  # raw deflate, without the zlib wrapper
        return _inflate(body, -zlib.MAX_WBITS, coding, max_bytes, wording)
    except zlib.error:
        raise wording.corrupt(coding, str(first)) from None


def _inflate(body: bytes, wbits: int, coding: str, max_bytes: int,
             wording: InflateWording) -> bytes:
    inflater = zlib.decompressobj(wbits)
    plain = inflater.decompress(body, max_bytes + 1)
    if len(plain) > max_bytes:
        raise wording.too_large(len(body), coding, max_bytes)
    if not inflater.eof:
        if wbits < 0:  # raw deflate has no header to fail on: a stream cut short is corrupt
            raise zlib.error("the compressed stream ends early")
        raise wording.truncated(coding)
    if inflater.unused_data:
        if wbits < 0:
            raise zlib.error(f"{len(inflater.unused_data)} bytes follow the compressed stream")
        raise wording.trailing(coding, len(inflater.unused_data))
    return plain
