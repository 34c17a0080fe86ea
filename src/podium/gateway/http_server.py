"""The gateway's HTTP/1.1 server protocol: uvicorn's httptools parser with a bounded request head.

httptools itself takes a request line and headers of any size (a 20 MB header is buffered and
handed to the app whole). This protocol counts the bytes of each request head as they arrive
and answers 431, naming the limit, once they pass `max_header_bytes`: at most the limit plus
two socket reads is ever held.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podium.errors import HeaderFieldsTooLarge
from podium.errors.render import instance_shape, json_error

# after a 431 the connection reads (and drops) what the client is still sending for this
# long before it closes: closing at once would reset it and could lose the answer
_LINGER_S = 2.0


def bounded_head_protocol(max_header_bytes: int, *, server: str = "the gateway",
                          flag: str = "--max-header-bytes") -> type[asyncio.Protocol]:
    """A uvicorn `http=` protocol class refusing request heads over `max_header_bytes`; the
    431 names `server` and the `flag` that sets the limit."""

    class BoundedHeadProtocol(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = False
        _began = False  # a message began in the read being parsed
        _refused = False

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            self._began = False
            super().data_received(data)
            # a head still incomplete after this read: count it, so one sent slowly or in
            # pieces is refused before it grows past the limit. The read it began in is not
            # counted: it may also hold the end of the request before (pipelining)
            if (self._in_head and not self._began and not self._refused
                    and not self.transport.is_closing()):
                self._head_bytes += len(data)
                if self._head_bytes > max_header_bytes:
                    self._refuse(self._head_bytes)

        def on_message_begin(self) -> None:
            if not self._refused:
                super().on_message_begin()
                self._in_head, self._head_bytes, self._began = True, 0, True

        def on_headers_complete(self) -> None:
            self._in_head = False
            # a whole head that came in one read: its size from the parsed parts
            size = len(self.url) + 16 + sum(len(k) + len(v) + 4 for k, v in self.headers)
            if size > max_header_bytes:
                self._refuse(size)
            elif not self._refused:
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

        def _refuse(self, size: int) -> None:
            self._refused = True
            error = HeaderFieldsTooLarge(
                f"the request line and headers exceed {server}'s limit of "
                f"{max_header_bytes} bytes ({flag}): {size} bytes came; send large values "
                "in the body")
            self.transport.write(_answer(error, path=self.url.decode("latin-1")))
            if self.transport.can_write_eof():  # not over TLS: there it closes after the linger
                self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)

    return BoundedHeadProtocol


def _answer(error: HeaderFieldsTooLarge, *, path: str) -> bytes:
    """A whole HTTP/1.1 response in the shape the gateway answers `path` with."""
    status, body = json_error(instance_shape(path), error)
    return (b"HTTP/1.1 %d Request Header Fields Too Large\r\n" % status
            + b"content-type: application/json\r\n"
            + b"content-length: " + str(len(body)).encode() + b"\r\n"
            + b"connection: close\r\n\r\n" + body)
