"""The gateway's HTTP/1.1 server protocol: uvicorn's httptools parser with a bounded request head
and an early answer for requests certain to be shed.

httptools itself takes a request line and headers of any size (a 20 MB header is buffered and
handed to the app whole). This protocol counts the bytes of each request head as they arrive
and answers 431, naming the limit, once they pass `max_header_bytes`: at most the limit plus
two socket reads is ever held.

Once a head is complete, `shed` (`gateway.early_shed`) may answer the request from its head
alone. Then no ASGI task is made: the body is dropped as it arrives, the answer is written when
the request ends, and the connection stays open for the next one. A request that expects
`100-continue`, or comes while an earlier one on its connection is still being answered
(pipelining), always goes to the app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from podium.errors import HeaderFieldsTooLarge
from podium.gateway.asgi import Answer, Headers, error_answer

Shed = Callable[[str, str, Headers], Answer | None]
"""(method, path, headers) → the answer to give a request from its head alone, or None."""

# after a 431 the connection reads (and drops) what the client is still sending for this
# long before it closes: closing at once would reset it and could lose the answer
_LINGER_S = 2.0


def bounded_head_protocol(max_header_bytes: int, *, server: str = "the gateway",
                          flag: str = "--max-header-bytes",
                          shed: Shed | None = None) -> type[asyncio.Protocol]:
    """A uvicorn `http=` protocol class refusing request heads over `max_header_bytes` (the
    431 names `server` and the `flag` that sets the limit) and answering early what `shed`
    answers."""

    class BoundedHeadProtocol(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = False
        _began = False  # a message began in the read being parsed
        _refused = False
        _early: bytes | None = None  # the answer `shed` gave the request being read
        _early_keep_alive = True

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
            elif not self._refused and not self._shed_early():
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused and self._early is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._early is not None:
                self._answer_early()
            elif not self._refused:
                super().on_message_complete()

        def _shed_early(self) -> bool:
            """Whether `shed` answers this request (then it is not the app's)."""
            if (shed is None or self.expect_100_continue or self.pipeline
                    or (self.cycle is not None and not self.cycle.response_complete)
                    or self.parser.should_upgrade()):
                return False
            raw_path = httptools.parse_url(self.url).path
            if b"%" in raw_path:  # the app's path is the decoded one
                return False
            answer = shed(self.parser.get_method().decode("ascii"), raw_path.decode("ascii"),
                          self.headers)
            if answer is None:
                return False
            self._early_keep_alive = (self.parser.get_http_version() != "1.0"
                                      and self.parser.should_keep_alive())
            self._early = _wire(answer, self.server_state.default_headers,
                                keep_alive=self._early_keep_alive)
            return True

        def _answer_early(self) -> None:
            answer, self._early = self._early, None
            assert answer is not None
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self.transport.write(answer)
            if not self._early_keep_alive:
                self.transport.close()
            else:  # idle until the next request, as after any answer
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def _refuse(self, size: int) -> None:
            self._refused = True
            error = HeaderFieldsTooLarge(
                f"the request line and headers exceed {server}'s limit of "
                f"{max_header_bytes} bytes ({flag}): {size} bytes came; send large values "
                "in the body")
            answer = error_answer(self.url.decode("latin-1"), error)
            self.transport.write(_wire(answer, [], keep_alive=False))
            if self.transport.can_write_eof():  # not over TLS: there it closes after the linger
                self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)

    return BoundedHeadProtocol


def _wire(answer: Answer, default_headers: list[tuple[bytes, bytes]], *,
          keep_alive: bool) -> bytes:
    """`answer` as uvicorn writes a whole response (its status line and default headers)."""
    parts = [STATUS_LINE[answer.status]]
    for name, value in [*default_headers, *answer.headers]:
        parts += [name, b": ", value, b"\r\n"]
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += [b"\r\n", answer.body]
    return b"".join(parts)
