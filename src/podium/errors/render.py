"""Every protocol's error, built from the hierarchy in one place: status, gRPC code and body.

`kind_of` walks the exception's MRO to the nearest class in `KINDS` (as Starlette finds an
exception handler), so a subclass inherits its parent's status unless it has its own row.
`problem_of` turns any exception into what a client is shown; the body functions lay that out
for one protocol each:

    openai_body    {"error": {"message", "type", "param", "code"}}   OpenAI routes (/v1)
    kserve_body    {"error": "message"}                              KServe v2 HTTP (Triton)
    control_body   the OpenAI shape, `code` the HTTP status          control-plane API
    grpc_status    (StatusCode name, details)                        KServe v2 gRPC

An exception outside the hierarchy is a bug: its text may hold paths, data or secrets, so the
client sees only "internal error" and a request id, and the log line with that id carries the
traceback. This module imports neither FastAPI nor grpc.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Literal

from podium.errors import (
    BackendDead,
    BackendError,
    ColdStart,
    Conflict,
    DeadlineExceeded,
    HeaderFieldsTooLarge,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    PackageError,
    PayloadTooLarge,
    PodiumError,
    RequestError,
    RequestTimeout,
    Unauthorized,
    Unavailable,
    UpstreamFailed,
)

Shape = Literal["openai", "kserve", "control"]
log = logging.getLogger("podium.errors")
_request_id: ContextVar[str | None] = ContextVar("podium_error_request_id", default=None)


def bind_request_id(request_id: str) -> Token[str | None]:
    """Name the request this task serves, so its errors and their log lines carry the id."""
    return _request_id.set(request_id)


def unbind_request_id(token: Token[str | None]) -> None:
    """Forget the id bound by `bind_request_id`."""
    _request_id.reset(token)


@dataclass(frozen=True)
class Kind:
    """How one class of error shows on the wire."""

    http_status: int
    grpc_code: str
    """A `grpc.StatusCode` name (a string, so this module needs no grpc)."""
    openai_type: str
    """The OpenAI error `type`."""


INTERNAL = Kind(500, "INTERNAL", "internal_error")
KINDS: dict[type[BaseException], Kind] = {
    PodiumError: INTERNAL,
    RequestError: Kind(400, "INVALID_ARGUMENT", "invalid_request_error"),
    Unauthorized: Kind(401, "UNAUTHENTICATED", "authentication_error"),
    NotFound: Kind(404, "NOT_FOUND", "not_found_error"),
    MethodNotAllowed: Kind(405, "UNIMPLEMENTED", "invalid_request_error"),
    Conflict: Kind(409, "ALREADY_EXISTS", "conflict_error"),
    RequestTimeout: Kind(408, "DEADLINE_EXCEEDED", "invalid_request_error"),
    PayloadTooLarge: Kind(413, "RESOURCE_EXHAUSTED", "invalid_request_error"),
    HeaderFieldsTooLarge: Kind(431, "RESOURCE_EXHAUSTED", "invalid_request_error"),
    Overloaded: Kind(429, "RESOURCE_EXHAUSTED", "rate_limit_error"),
    DeadlineExceeded: Kind(504, "DEADLINE_EXCEEDED", "timeout_error"),
    Unavailable: Kind(503, "UNAVAILABLE", "service_unavailable"),
    UpstreamFailed: Kind(502, "UNAVAILABLE", "service_unavailable"),
    ColdStart: Kind(503, "UNAVAILABLE", "service_unavailable"),
    PackageError: Kind(400, "INVALID_ARGUMENT", "invalid_request_error"),
    BackendError: INTERNAL,
    BackendDead: Kind(503, "UNAVAILABLE", "service_unavailable"),
}


def kind_of(exc: BaseException) -> Kind:
    """The nearest mapped class in the exception's MRO; INTERNAL for anything unmapped."""
    for cls in type(exc).__mro__:
        kind = KINDS.get(cls)
        if kind is not None:
            return kind
    return INTERNAL


@dataclass(frozen=True)
class Problem:
    """An exception as a client is shown it."""

    kind: Kind
    message: str
    param: str | None = None


def problem_of(exc: BaseException, request_id: str | None = None) -> Problem:
    """What the client sees of `exc`; logs server faults with the request id they name.

    The id is `request_id`, else the one bound for this task, else a fresh one."""
    kind = kind_of(exc)
    request_id = request_id or _request_id.get()
    if isinstance(exc, PodiumError):
        if kind.http_status >= 500:
            log.warning("request %s failed: %s", request_id or "-", exc.message)
        return Problem(kind, exc.message, exc.param)
    request_id = request_id or uuid.uuid4().hex
    log.error("request %s failed with an unexpected %s", request_id, type(exc).__name__,
              exc_info=(type(exc), exc, exc.__traceback__))
    return Problem(kind, f"internal error (request id {request_id}); the server log has the "
                         "details under this id")


def retry_after(exc: BaseException) -> str | None:
    """The `Retry-After` header (whole seconds, at least 1) an overload answer carries, and
    a cold start's 503."""
    if isinstance(exc, Overloaded | ColdStart):
        return str(max(1, math.ceil(exc.retry_after_s)))
    return None


def openai_body(problem: Problem) -> dict[str, Any]:
    """The OpenAI API's error object."""
    return {"error": {"message": problem.message, "type": problem.kind.openai_type,
                      "param": problem.param, "code": problem.kind.http_status}}


def kserve_body(problem: Problem) -> dict[str, Any]:
    """Triton's error body."""
    return {"error": problem.message}


def control_body(problem: Problem) -> dict[str, Any]:
    """The control API's error: the OpenAI shape, so `/v1` errors read alike everywhere."""
    return openai_body(problem)


def grpc_status(problem: Problem) -> tuple[str, str]:
    """The gRPC status code name and details."""
    return problem.kind.grpc_code, problem.message


BODIES = {"openai": openai_body, "kserve": kserve_body, "control": control_body}


OPENAI_OUTSIDE_V1 = ("/tokenize", "/detokenize", "/invocations")
"""The OpenAI API's paths outside /v1, as `vllm serve` has them."""


def instance_shape(path: str) -> Shape:
    """The shape an instance (or the gateway in front of it) answers on `path`."""
    return "openai" if path.startswith("/v1") or path in OPENAI_OUTSIDE_V1 else "kserve"


def json_error(shape: Shape, exc: BaseException, request_id: str | None = None
               ) -> tuple[int, bytes]:
    """HTTP status and JSON body of `exc` in `shape`; the same bytes wherever it is rendered."""
    problem = problem_of(exc, request_id)
    return problem.kind.http_status, encode(BODIES[shape](problem))


def encode(body: dict[str, Any]) -> bytes:
    """JSON as Starlette's JSONResponse writes it."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode()


def cli_line(exc: PodiumError) -> str:
    """The CLI's one-line error (it exits 2: the user can act on every PodiumError)."""
    return f"podium: error: {exc.message}"
