"""Podium's exception hierarchy, drawn once; `podium.errors.render` maps it to every protocol.

    PodiumError                 500 INTERNAL
    ├── RequestError            a bad request: that request fails, the server keeps serving
    │   ├── InvalidArgument     400 INVALID_ARGUMENT
    │   ├── Unauthorized        401 UNAUTHENTICATED
    │   ├── NotFound            404 NOT_FOUND
    │   ├── MethodNotAllowed    405 UNIMPLEMENTED
    │   ├── Conflict            409 ALREADY_EXISTS
    │   ├── PayloadTooLarge     413 RESOURCE_EXHAUSTED
    │   (+ RequestTimeout 408)
    │   └── HeaderFieldsTooLarge 431 RESOURCE_EXHAUSTED
    ├── Overloaded              429 RESOURCE_EXHAUSTED + Retry-After: a queue is full
    ├── DeadlineExceeded        504 DEADLINE_EXCEEDED: the request's own deadline passed while
    │                           it ran (X-Request-Timeout, the gRPC deadline); its work stopped
    ├── Unavailable             503 UNAVAILABLE: not ready yet, draining, or shutting down
    │   └── UpstreamFailed      502 UNAVAILABLE: an instance failed mid-request (gateway)
    ├── PackageError            400: a package or manifest is invalid (exit 2 at the CLI)
    │   ├── UnsafeArchive       an archive tried to escape its directory or hold device files
    │   └── EngineVersionMismatch  a package asks for an engine other than the platform's pin
    ├── BootError               a boot step failed: the instance never reports ready
    └── BackendError            500 INTERNAL: the model failed on a request it accepted
        └── BackendDead         503 UNAVAILABLE: the engine is gone; the instance must restart

`BackendDead` differs from its parent on purpose: the request was fine and the model did not
fail on it, the process serving it can no longer serve anything. 503 / UNAVAILABLE tells a
client to try again elsewhere or later, as for a draining instance; 500 would blame this
request. (A 503 counts as an error in rollout analysis; the gateway re-sends it only where
`podium.gateway.retry` says: a canary's, once, to the stable version.) Any other exception is a bug:
it renders as 500 / INTERNAL with a message naming the request id, and the log line with that
id carries the traceback.
"""

from __future__ import annotations


class PodiumError(Exception):
    """Base of every error Podium raises on purpose; `message` is shown to the client."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class RequestError(PodiumError):
    """The request is wrong; the client can fix it."""


class InvalidArgument(RequestError):
    """A field or value is invalid (`param` names it)."""


class Unauthorized(RequestError):
    """No valid API key."""


class NotFound(RequestError):
    """The model, version or route does not exist."""


class MethodNotAllowed(RequestError):
    """The route exists but not with this HTTP method."""


class Conflict(RequestError):
    """The request contradicts the current state (e.g. announcing a version twice)."""


class RequestTimeout(RequestError):
    """The client stopped sending its body before it was complete."""


class PayloadTooLarge(RequestError):
    """The body is past the server's limit."""


class HeaderFieldsTooLarge(RequestError):
    """The request's headers, all together, are past the server's limit."""


class Overloaded(PodiumError):
    """A bounded queue is full (or its wait ran out): the request was not started. Overload is
    never a 5xx: the client is told when to come back (`Retry-After`, seconds)."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0,
                 param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(PodiumError):
    """The request's own deadline (`X-Request-Timeout`, the gRPC call's) passed after it was
    admitted: its work was stopped (the engine aborted it) and it is answered 504 /
    DEADLINE_EXCEEDED. A request refused before it starts because it cannot finish in time is
    `Overloaded` instead: nothing ran, the load ahead of it is the cause."""

    def __init__(self, message: str, *, param: str | None = "X-Request-Timeout") -> None:
        super().__init__(message, param=param)


class Unavailable(PodiumError):
    """The server cannot take the request now; another instance or a retry may."""


class ColdStart(Unavailable):
    """A request held for a version at zero instances found no ready instance in time (or
    too many wait already): 503, and the client is told when to come back (`Retry-After`)."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0,
                 param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class UpstreamFailed(Unavailable):
    """The gateway sent the request to an instance that failed before answering."""


class PackageError(PodiumError):
    """A package or its manifest is invalid."""


class UnsafeArchive(PackageError):
    """An archive tried to escape its directory or hold device files."""


class EngineVersionMismatch(PackageError):
    """A package asks for an engine other than the platform's pinned one."""


class BootError(PodiumError):
    """A boot step failed; the instance never reports ready."""


class BackendError(PodiumError):
    """Recoverable: the model failed on one request; that request fails, the model serves on."""


class BackendDead(BackendError):
    """Fatal: the engine is gone for good (vLLM's EngineDeadError). The repository takes the
    version out of service and the instance exits 1 (`ModelRepository.report_dead`)."""
