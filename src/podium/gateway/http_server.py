"""The gateway's HTTP/1.1 server protocol: the edge's bounded request head
(`podium.edge.head`) plus an early answer for requests certain to be shed.

Once a head is complete, `shed` (`gateway.early_shed`) may answer the request from its head
alone. Then no ASGI task is made: the body is dropped as it arrives, the answer is written when
the request ends, and the connection stays open for the next one. A request that expects
`100-continue`, or comes while an earlier one on its connection is still being answered
(pipelining), always goes to the app.
"""

from __future__ import annotations

from collections.abc import Callable

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podium.edge import head as edge_head
from podium.edge.head import wire
from podium.gateway.asgi import Answer, Headers

Shed = Callable[[str, str, Headers], Answer | None]
"""(method, path, headers) → the answer to give a request from its head alone, or None."""


def bounded_head_protocol(max_header_bytes: int, *, server: str = "the gateway",
                      flag: str = "--max-header-bytes",
                      shed: Shed | None = None) -> type[HttpToolsProtocol]:
    """A uvicorn `http=` protocol class refusing request heads over `max_header_bytes` (the
    431 names `server` and the `flag` that sets the limit) and answering early what `shed`
    answers."""
    bounded = edge_head.bounded_head_protocol(max_header_bytes, server=server, flag=flag)
    if shed is None:
        return bounded

    class SheddingProtocol(bounded):  # type: ignore[valid-type,misc]
        _early: bytes | None = None  # the answer `shed` gave the request being read
        _early_keep_alive = True

        def head_complete(self) -> None:
            if not self._shed_early():
                super().head_complete()

        def on_body(self, body: bytes) -> None:
            if self._early is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._early is not None:
                self._answer_early()
            else:
                super().on_message_complete()

        def _shed_early(self) -> bool:
            """Whether `shed` answers this request (then it is not the app's)."""
            if (self.expect_100_continue or self.pipeline
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
            self._early = wire(answer.status,
                               [*self.server_state.default_headers, *answer.headers],
                               answer.body, keep_alive=self._early_keep_alive)
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

    return SheddingProtocol
