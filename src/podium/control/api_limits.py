"""What the control API checks before a route sees a request: headers, body, paths.

`RequestLimits` refuses headers over `max_header_bytes` in all, buffers the body (at most
`max_body_bytes`, declared or actually sent), refuses compressed bodies (never decoded, so no
gzip bomb), and refuses anything that is not UTF-8 JSON nested at most `MAX_JSON_DEPTH` deep,
each with a 4xx naming the limit and the value. Bodies of the control API are a few hundred
bytes, so parsing them once here and again in the route is cheap.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from podium.errors import HeaderFieldsTooLarge, InvalidArgument, PayloadTooLarge, PodiumError

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
MAX_JSON_DEPTH = 32
MAX_PATH_CHARS = 4096

Render = Callable[[PodiumError], Response]


class RequestLimits:
    """ASGI middleware: a request over a limit is answered here and never reaches a route."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, render: Render,
                 max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
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
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        raw_headers = scope.get("headers", [])
        header_bytes = sum(len(k) + len(v) + 4 for k, v in raw_headers)  # + ": " and CRLF
        if header_bytes > self.max_header_bytes:
            raise HeaderFieldsTooLarge(f"request headers of {header_bytes} bytes exceed the "
                                       f"control API's {self.max_header_bytes}-byte limit "
                                       "(podium up --api-max-header-bytes)")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}
        limit = self.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise InvalidArgument(f"Content-Length={declared[:40]!r} is not a byte count",
                                      param="Content-Length")
            if int(declared) > limit:
                raise PayloadTooLarge(f"request body of {declared} bytes exceeds the control "
                                      f"API's {limit}-byte limit (podium up "
                                      "--api-max-body-bytes)", param="Content-Length")
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise InvalidArgument(f"Content-Encoding={encoding[:40]!r} is not accepted: the "
                                  "control API takes plain JSON; send it uncompressed",
                                  param="Content-Encoding")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the control API's {limit}-byte "
                                      "limit (podium up --api-max-body-bytes)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body.strip():
            _check_json(body, headers.get("content-type", ""))
        return body


def _replay(body: bytes, receive: Receive) -> Callable[[], Awaitable[Message]]:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: only the client's disconnect is left

    return replayed


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
    depth = _depth(value)
    if depth > MAX_JSON_DEPTH:
        raise InvalidArgument(f"the request body is nested {depth} levels deep; the limit is "
                              f"{MAX_JSON_DEPTH}")


def _no_constant(name: str) -> Any:
    raise InvalidArgument(f"{name} is not a JSON number; send a finite number")


def _depth(value: Any) -> int:
    """Nesting depth of arrays and objects, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


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
