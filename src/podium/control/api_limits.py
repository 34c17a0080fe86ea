"""What the control API checks before a route sees a request: headers, body, paths.

`RequestLimits` buffers the body (at most `max_body_bytes`, declared or actually sent: the
edge's read, `podium.edge.body`), refuses compressed bodies (never decoded, so no gzip bomb),
and refuses anything that is not UTF-8 JSON nested at most `MAX_JSON_DEPTH` deep, each with a
4xx naming the limit and the value. Headers are bounded by the HTTP protocol the API is served
with (`podium.edge.head`). Bodies of the control API are a few hundred
bytes, so parsing them once here and again in the route is cheap.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from podium.edge.body import BodyWording, content_length, read_body, replay
from podium.edge.json_checks import depth_of
from podium.errors import InvalidArgument, PodiumError

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
MAX_JSON_DEPTH = 32
MAX_PATH_CHARS = 4096

Render = Callable[[PodiumError], Response]


class _ApiWording(BodyWording):
    """The control API's body refusals: its limit and `podium up` flag; a Content-Length that
    is not a number is a 400; a client that leaves ends the body."""

    def bad_length(self, value: str) -> PodiumError:
        return InvalidArgument(f"Content-Length={value[:40]!r} is not a byte count",
                               param="Content-Length")

    def left(self, size: int, declared: int | None) -> None:
        return None


_WORDING = _ApiWording(whose="the control API's ", flag="podium up --api-max-body-bytes",
                       declared_param="Content-Length")


class RequestLimits:
    """ASGI middleware: a request over a limit is answered here and never reaches a route.

    The request head is bounded before the app sees it, by the HTTP protocol the control API
    is served with (`podium.edge.head`, `podium up --api-max-header-bytes`)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, render: Render) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except PodiumError as exc:
            await self.render(exc)(scope, receive, send)
            return
        await self.app(scope, replay(body, receive), send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        declared = content_length(scope.get("headers", []), _WORDING)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        too_large = declared is not None and declared > self.max_body_bytes  # a 413 comes first
        if not too_large and encoding not in ("", "identity"):
            raise InvalidArgument(f"Content-Encoding={encoding[:40]!r} is not accepted: the "
                                  "control API takes plain JSON; send it uncompressed",
                                  param="Content-Encoding")
        body = await read_body(receive, self.max_body_bytes, declared=declared,
                               wording=_WORDING)
        if body.strip():
            _check_json(body, headers.get("content-type", ""))
        return body


def _check_json(body: bytes, content_type: str) -> None:
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise InvalidArgument(f"Content-Type={content_type[:60]!r} is not JSON; send the body "
                              "with Content-Type: application/json", param="Content-Type")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"the request body is not UTF-8 (byte 0x{body[exc.start]:02x} at "
                              f"offset {exc.start}); send UTF-8 JSON") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"the request body is not valid JSON ({exc}); send a JSON "
                              "object") from None
    except RecursionError:
        raise InvalidArgument(f"the request body is nested deeper than {MAX_JSON_DEPTH} "
                              "levels; send a flat JSON object") from None
    depth = depth_of(value)
    if depth > MAX_JSON_DEPTH:
        raise InvalidArgument(f"the request body is nested {depth} levels deep; the limit is "
                              f"{MAX_JSON_DEPTH}")


def _no_constant(name: str) -> Any:
    raise InvalidArgument(f"{name} is not a JSON number; send a finite number")


def checked_package_path(path: str, roots: tuple[Path, ...] = ()) -> str:
    """`path` when it names a directory or regular file (under one of `roots`, when given);
    it is only `stat`ed, never opened, so a FIFO or a device cannot block the API."""
    if "\x00" in path:
        raise InvalidArgument("path contains a NUL byte; send the package's real path",
                              param="path")
    if not os.path.isabs(path):
        raise InvalidArgument(f"path={path[:200]!r} is relative; send an absolute path on the "
                              "control plane's machine (`podium announce` does)", param="path")
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InvalidArgument(f"path={path[:200]!r}: {exc.strerror}; send a package directory "
                              "or .tar.gz that exists", param="path") from None
    if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        raise InvalidArgument(f"path={path[:200]!r} is a {_kind(info.st_mode)}; a package is a "
                              "directory or a .tar.gz file", param="path")
    if roots:
        real = Path(path).resolve()
        if not any(real.is_relative_to(root.resolve()) for root in roots):
            allowed = ", ".join(str(r) for r in roots)
            raise InvalidArgument(f"path={path[:200]!r} is outside the package roots this "
                                  f"control plane accepts ({allowed}; podium up "
                                  "--package-root)", param="path")
    return path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"
