"""An answer from the request's head alone: the HTTP protocol under the gateway and the instance
asks `early(method, path, headers)` as soon as a head is parsed (and within the head bound,
`edge.head`), and when it answers (a refusal certain from the head: every instance or engine
behind the path is full) no ASGI task is made: the body is dropped as it arrives, the answer
is written when the request ends, and the connection stays open for the next one. A request
that expects `100-continue`, comes while an earlier one on its connection is still being
answered (pipelining), asks for an upgrade or has an escaped path always goes to the app.

At several times a server's capacity most requests are refusals, and a refusal through the
app (a task, the middleware, the body read and parsed, routing, the error rendered) costs the
event loop nearly what serving one does: the refusals alone saturate it and every request
waits behind them (`bench/overload_xgb.py`, `bench/overload.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podium.edge.head import Headers, wire


class EarlyAnswer(Protocol):
    """A whole response decided from a request's head.

    An answer may also carry `keeps_body` (an int, bytes): then the request's body, up to that
    many bytes, is kept as it arrives and set as its `request_body` before `sent` is called
    (None when the body was longer), for a log line or count that only the body can name
    (the instance's refusal for a model whose body may name a LoRA adapter). The answer
    itself is still the head's."""

    status: int
    headers: Headers
    body: bytes


Early = Callable[[str, str, Headers], EarlyAnswer | None]
"""(method, path, headers) → the answer to give a request from its head alone, or None."""
Sent = Callable[[EarlyAnswer], None]
"""Called once an early answer is written (the instance logs and counts it there)."""


def early_answer_protocol(base: type[HttpToolsProtocol], early: Early,
                          sent: Sent | None = None) -> type[HttpToolsProtocol]:
    """A subclass of `base` (a head-bounded protocol, `edge.head.bounded_head_protocol`)
    answering what `early` answers from the head alone."""

    class EarlyAnswerProtocol(base):  # type: ignore[valid-type,misc]
        _early: bytes | None = None  # the answer `early` gave the request being read
        _early_answer: EarlyAnswer | None = None
        _early_keep_alive = True
        _early_body: bytearray | None = None  # the body kept for an answer with keeps_body
        _early_body_limit = 0

        def head_complete(self) -> None:
            if not self._answer_from_head():
                super().head_complete()

        def on_body(self, body: bytes) -> None:
            if self._early is None:
                super().on_body(body)
            elif self._early_body is not None:
                if len(self._early_body) + len(body) <= self._early_body_limit:
                    self._early_body += body
                else:  # longer than the answer wants: dropped, as every early body is
                    self._early_body = None

        def on_message_complete(self) -> None:
            if self._early is not None:
                self._answer_early()
            else:
                super().on_message_complete()

        def _answer_from_head(self) -> bool:
            """Whether `early` answers this request (then it is not the app's)."""
            if (self.expect_100_continue or self.pipeline
                    or (self.cycle is not None and not self.cycle.response_complete)
                    or self.parser.should_upgrade()):
                return False
            raw_path = httptools.parse_url(self.url).path
            if b"%" in raw_path:  # the app's path is the decoded one
                return False
            answer = early(self.parser.get_method().decode("ascii"),
                           raw_path.decode("ascii"), self.headers)
            if answer is None:
                return False
            self._early_keep_alive = (self.parser.get_http_version() != "1.0"
                                      and self.parser.should_keep_alive())
            self._early = wire(answer.status,
                               [*self.server_state.default_headers, *answer.headers],
                               answer.body, keep_alive=self._early_keep_alive)
            self._early_answer = answer
            self._early_body_limit = int(getattr(answer, "keeps_body", 0) or 0)
            self._early_body = bytearray() if self._early_body_limit > 0 else None
            return True

        def _answer_early(self) -> None:
            raw, self._early = self._early, None
            answer, self._early_answer = self._early_answer, None
            assert raw is not None and answer is not None
            if self._early_body_limit > 0:
                kept, self._early_body, self._early_body_limit = self._early_body, None, 0
                setattr(answer, "request_body", None if kept is None else bytes(kept))  # noqa: B010
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self.transport.write(raw)
            if sent is not None:
                sent(answer)
            if not self._early_keep_alive:
                self.transport.close()
            else:  # idle until the next request, as after any answer
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler)

    return EarlyAnswerProtocol
