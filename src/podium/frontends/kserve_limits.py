"""Limits of the KServe frontends, and reading an HTTP body within them.

Every limit has a `podium serve` flag (named in the error a client gets past it) and a default
documented in `docs/operations.md`. A body is capped twice: as sent, and once inflated
(`Content-Encoding: gzip | deflate`), where inflation stops at the cap instead of expanding a
bomb into memory. Both caps are the edge's (`podium.edge`); the wording is KServe's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from podium.edge.body import DEFAULT_MAX_BODY_BYTES, read_request_body
from podium.edge.inflate import DEFAULT_MAX_INFLATED_BYTES, InflateWording, check_coding
from podium.edge.inflate import inflate as edge_inflate
from podium.edge.json_checks import DEFAULT_MAX_JSON_DEPTH
from podium.errors import InvalidArgument, PayloadTooLarge, PodiumError

if TYPE_CHECKING:
    from starlette.requests import Request

DEFAULT_MAX_TENSORS = 64
DEFAULT_MAX_ELEMENTS = 16 * 1024 * 1024
DEFAULT_GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


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


class _KServeWording(InflateWording):
    """A compressed KServe body's refusals, as Triton-compatible clients have read them."""

    def unknown(self, coding: str) -> PodiumError:
        return InvalidArgument(f"Content-Encoding {coding!r} is not supported; use gzip, "
                               "deflate or none", param="Content-Encoding")

    def too_large(self, compressed: int, coding: str, max_bytes: int) -> PodiumError:
        return PayloadTooLarge(f"the {coding} body inflates past the {max_bytes}-byte "
                               "limit (--max-inflated-bytes)")

    def corrupt(self, coding: str, detail: str) -> PodiumError:
        return InvalidArgument(f"body is not valid {coding} ({detail})",
                               param="Content-Encoding")

    def truncated(self, coding: str) -> PodiumError:
        return self.corrupt(coding, "the compressed stream ends early")

    def trailing(self, coding: str, num_bytes: int) -> PodiumError:
        return self.corrupt(coding, f"{num_bytes} bytes follow the compressed stream")


_WORDING = _KServeWording(server="the instance", flag="--max-inflated-bytes",
                          codings=frozenset({"gzip", "deflate"}))


async def read_body(request: Request, limits: KServeLimits) -> bytes:
    """The body, inflated if compressed; 413 past either cap, 400 for an unknown encoding."""
    encoding = request.headers.get("content-encoding", "")
    check_coding(encoding, _WORDING)  # before the body is read
    raw = await read_request_body(request.scope, request.receive, limits.max_body_bytes)
    return inflate(raw, encoding, limits.max_inflated_bytes)


def inflate(raw: bytes, encoding: str, max_bytes: int) -> bytes:
    """Inflate gzip or deflate (zlib-wrapped, or raw as some clients send it) up to
    `max_bytes`; one byte more is a 413 rather than a bomb held in memory."""
    return edge_inflate(raw, encoding, max_bytes, _WORDING)


__all__ = ["KServeLimits", "inflate", "read_body"]
