"""The request-head bound: uvicorn's httptools protocol, refusing a request line plus headers
past a byte limit with a 431 that names the server and the flag.

httptools itself takes a request line and headers of any size (a 20 MB header is buffered and
handed to the app whole). This protocol counts the bytes of each request head as they arrive
and answers 431 once they pass `max_header_bytes`: at most the limit plus two socket reads is
ever held. The instance, the gateway and the control API all serve through it; the answer has
the shape an instance gives on the path (`errors.render.instance_shape`).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from podium.errors import HeaderFieldsTooLarge
from podium.errors.render import instance_shape, json_error

Headers = list[tuple[bytes, bytes]]

# after a 431 the connection reads (and drops) what the client is still sending for this
# long before it closes: closing at once would reset it and could lose the answer
_LINGER_S = 2.0


def bounded_head_protocol(max_header_bytes: int, *, server: str = "the gateway",
                          flag: str = "--max-header-bytes",
                          base: type[HttpToolsProtocol] = HttpToolsProtocol
                          ) -> type[HttpToolsProtocol]:
    """A uvicorn `http=` protocol class (a subclass of `base`) refusing request heads over
    `max_header_bytes`; the 431 names `server` and the `flag` that sets the limit.

    A subclass that needs the whole head (the gateway's early shed) overrides
    `head_complete`, which runs only for a head within the limit.
    """

    class BoundedHeadProtocol(base):  # type: ignore[valid-type,misc]
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
                self.head_complete()

        def head_complete(self) -> None:
            """A head within the limit is complete: hand the request on."""
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
            status, body = json_error(instance_shape(self.url.decode("latin-1")), error)
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]
            self.transport.write(wire(status, headers, body, keep_alive=False))
            if self.transport.can_write_eof():  # not over TLS: there it closes after the linger
                self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)

    return BoundedHeadProtocol


def wire(status: int, headers: Headers, body: bytes, *, keep_alive: bool) -> bytes:
    """A whole response as uvicorn writes one: its status line, `headers`, `body`."""
    parts = [STATUS_LINE[status]]
    for name, value in headers:
        parts += [name, b": ", value, b"\r\n"]
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += [b"\r\n", body]
    return b"".join(parts)
