"""One place that turns exceptions into HTTP responses, in the shape of the route's protocol.

OpenAI routes (/v1) answer `{"error": {"message", "type", "param", "code"}}`; KServe and
everything else answer Triton's `{"error": "..."}`. The status comes from the exception class
(walking its MRO, so subclasses inherit their parent's mapping).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from podium.errors import InvalidArgument, PodiumError

log = logging.getLogger("podium.server")


def error_response(path: str, exc: PodiumError) -> JSONResponse:
    status = exc.http_status
    if path.startswith("/v1"):
        body = {"error": {"message": exc.message, "type": exc.openai_type, "param": exc.param,
                          "code": status}}
    else:
        body = {"error": exc.message}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(PodiumError)
    async def podium_error(request: Request, exc: PodiumError) -> JSONResponse:
        if exc.http_status >= 500:
            log.error("request %s %s failed: %s", request.method, request.url.path, exc.message)
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return error_response(request.url.path, InvalidArgument("; ".join(parts)))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        error = PodiumError(str(exc.detail))
        error.http_status = exc.status_code
        error.openai_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(request.url.path, error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, PodiumError(f"internal error: {exc}"))
