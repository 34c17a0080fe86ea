"""Errors of a FastAPI app (an instance, the control API) rendered by `podium.errors.render`."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from podium.errors import (
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    PodiumError,
    Unauthorized,
)
from podium.errors.render import Shape, json_error, retry_after

ShapeOf = Callable[[str], Shape]
_BY_STATUS: dict[int, type[PodiumError]] = {401: Unauthorized, 404: NotFound,
                                            405: MethodNotAllowed, 413: PayloadTooLarge}


def error_response(shape: Shape, exc: BaseException, request_id: str | None = None) -> Response:
    """`exc` as a JSON response in `shape`."""
    status, body = json_error(shape, exc, request_id)
    response = Response(body, status_code=status, media_type="application/json")
    if (seconds := retry_after(exc)) is not None:
        response.headers["Retry-After"] = seconds
    return response


def install_error_handlers(app: FastAPI, shape_of: ShapeOf) -> None:
    """Render every error `app` raises in the shape `shape_of(path)` names.

    A 500's message names the request id the request log bound (`render.bind_request_id`).
    """
    def respond(request: Request, exc: BaseException) -> Response:
        return error_response(shape_of(request.url.path), exc)

    @app.exception_handler(PodiumError)
    async def podium_error(request: Request, exc: PodiumError) -> Response:
        return respond(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return respond(request, InvalidArgument("; ".join(parts)))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        cls = _BY_STATUS.get(exc.status_code, InvalidArgument)
        response = respond(request, cls(str(exc.detail)))
        response.headers.update(exc.headers or {})
        return response

    # inside the app's other middleware (the request log's, auth), unlike a handler for
    # Exception, which Starlette runs outermost, after the request's id is gone
    app.add_middleware(UnexpectedErrors, shape_of=shape_of)


class UnexpectedErrors:
    """ASGI middleware: an exception outside the hierarchy becomes a 500 naming the request id.

    Once the response has started (a stream) nothing can be sent; the exception propagates.
    """

    def __init__(self, app: ASGIApp, *, shape_of: ShapeOf) -> None:
        self.app = app
        self.shape_of = shape_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            response = error_response(self.shape_of(scope["path"]), exc)
            await response(scope, receive, send)
