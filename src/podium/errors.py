"""Podium's exception hierarchy, drawn once; frontends map it to HTTP status and gRPC code.

    PodiumError
    ├── RequestError            a bad request: that request fails, the server keeps serving
    │   ├── InvalidArgument     400
    │   ├── Unauthorized        401
    │   ├── NotFound            404
    │   ├── Conflict            409
    │   └── PayloadTooLarge     413
    ├── Unavailable             503: not ready yet, draining, or shutting down
    ├── PackageError            a package or manifest is invalid (400 at the API, exit 2 at the CLI)
    │   └── UnsafeArchive       an archive tried to escape its directory or hold device files
    ├── EngineVersionMismatch   a package asks for an engine other than the platform's pin
    ├── BootError               a boot step failed: the instance never reports ready
    └── BackendError            the model failed on a request it accepted (500, recoverable)
        └── BackendDead         the engine is gone; the instance must restart (fatal)
"""

from __future__ import annotations


class PodiumError(Exception):
    """Base of every error Podium raises on purpose."""

    http_status = 500
    grpc_code = "INTERNAL"
    openai_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class RequestError(PodiumError):
    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class InvalidArgument(RequestError):
    pass


class Unauthorized(RequestError):
    http_status = 401
    grpc_code = "UNAUTHENTICATED"
    openai_type = "authentication_error"


class NotFound(RequestError):
    http_status = 404
    grpc_code = "NOT_FOUND"
    openai_type = "not_found_error"


class Conflict(RequestError):
    http_status = 409
    grpc_code = "ALREADY_EXISTS"
    openai_type = "conflict_error"


class PayloadTooLarge(RequestError):
    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class Unavailable(PodiumError):
    http_status = 503
    grpc_code = "UNAVAILABLE"
    openai_type = "service_unavailable"


class PackageError(PodiumError):
    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class UnsafeArchive(PackageError):
    pass


class EngineVersionMismatch(PackageError):
    pass


class BootError(PodiumError):
    pass


class BackendError(PodiumError):
    """Recoverable: the model failed on one request; that request fails, the model serves on."""


class BackendDead(BackendError):
    """Fatal: the engine is gone for good (vLLM's EngineDeadError). The repository takes the
    version out of service and the instance exits 1 (`ModelRepository.report_dead`)."""

    http_status = 500
    grpc_code = "INTERNAL"
