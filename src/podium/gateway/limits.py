"""The gateway's input limits (and its per-instance in-flight bound), and the HTTP body read
(the edge's, `podium.edge.body`) that keeps to them.

Every limit is a field of `GatewayLimits` (one flag of `podium up` each, documented in
`docs/operations.md`). A request past one fails alone with a 4xx naming the limit, its value and
the flag; the gateway never buffers more than a limit allows and serves on.
"""

from __future__ import annotations

import argparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from podium.edge.body import DEFAULT_MAX_BODY_BYTES, BodyWording, read_request_body
from podium.errors import InvalidArgument, PayloadTooLarge, PodiumError
from podium.gateway.asgi import Receive, Scope

DEFAULT_MAX_HEADER_BYTES = 64 << 10
DEFAULT_MAX_GRPC_MESSAGE_BYTES = 256 << 20
"""The same as an instance's gRPC server accepts."""
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_IN_FLIGHT_PER_INSTANCE = 256
"""Above an instance's own default queue plus batch, so its own 429 usually answers first; the
bound keeps the gateway from piling up requests an overloaded instance cannot take."""


class GatewayLimits(BaseModel):
    """How much the gateway accepts from one client request, and keeps in flight on one
    instance."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024,
                                description="Largest HTTP request body (413 past it).")
    max_header_bytes: int = Field(default=DEFAULT_MAX_HEADER_BYTES, ge=1024,
                                  description="Largest HTTP request head: request line plus "
                                  "headers (431 past it).")
    max_grpc_message_bytes: int = Field(default=DEFAULT_MAX_GRPC_MESSAGE_BYTES, ge=1024,
                                        description="Largest gRPC request message "
                                        "(RESOURCE_EXHAUSTED past it).")
    body_timeout_s: float = Field(default=DEFAULT_BODY_TIMEOUT_S, gt=0,
                                  description="Longest wait for the next piece of a request "
                                  "body (408 past it).")
    max_in_flight_per_instance: int = Field(
        default=DEFAULT_MAX_IN_FLIGHT_PER_INSTANCE, ge=1, le=1_000_000,
        description="Most requests this gateway keeps in flight on one instance (HTTP and "
        "gRPC together); when every instance of the routed version is at it, a request is "
        "answered 429 / RESOURCE_EXHAUSTED at once.")


_FLAGS = {"max_body_bytes": "--max-body-bytes", "max_header_bytes": "--max-header-bytes",
          "max_grpc_message_bytes": "--max-grpc-message-bytes",
          "body_timeout_s": "--body-timeout",
          "max_in_flight_per_instance": "--max-in-flight-per-instance"}
_UNITS = {"_s": "seconds", "_bytes": "bytes", "_instance": "requests"}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per limit, on the command that starts the gateway (`podium up`)."""
    for name, flag in _FLAGS.items():
        info = GatewayLimits.model_fields[name]
        unit = next(u for suffix, u in _UNITS.items() if name.endswith(suffix))
        parser.add_argument(flag, dest=f"gateway_{name}", metavar=unit.upper(),
                            type=float if unit == "seconds" else int, default=info.default,
                            help=f"gateway: {info.description} Default {info.default} {unit}.")


def from_flags(args: argparse.Namespace) -> GatewayLimits:
    """The limits given by `add_flags`' flags; a bad value names its flag."""
    try:
        return GatewayLimits(**{name: getattr(args, f"gateway_{name}") for name in _FLAGS})
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        raise InvalidArgument(f"{_FLAGS[name]}={error['input']}: {error['msg'].lower()}",
                              param=name) from None


def to_flags(limits: GatewayLimits) -> list[str]:
    """The `add_flags` flags that give these limits (for a gateway process `podium up` runs)."""
    return [arg for name, flag in _FLAGS.items() for arg in (flag, str(getattr(limits, name)))]


class _GatewayWording(BodyWording):
    """The gateway's body refusals (its limit, its flags)."""

    def declared_too_large(self, declared: int, max_bytes: int) -> PodiumError:
        return PayloadTooLarge(f"the request body of {declared} bytes (Content-Length) exceeds "
                               f"the gateway's limit of {max_bytes} bytes (--max-body-bytes)")

    def sent_too_large(self, max_bytes: int) -> PodiumError:
        return PayloadTooLarge(f"the request body exceeds the gateway's limit of {max_bytes} "
                               f"bytes (--max-body-bytes): more than {max_bytes} bytes arrived "
                               "without a Content-Length")


_WORDING = _GatewayWording()


async def read_body(scope: Scope, receive: Receive, limits: GatewayLimits) -> bytes:
    """The whole request body, refused (413) once it is declared or sent past the limit, and
    (408) when it stops arriving for `body_timeout_s`; the edge's read
    (`podium.edge.body`)."""
    return await read_request_body(scope, receive, limits.max_body_bytes,
                                   stall_s=limits.body_timeout_s, wording=_WORDING)
