"""The gateway's HTTP/1.1 server protocol: the edge's bounded request head
(`podium.edge.head`) plus an early answer for requests certain to be shed
(`gateway.early_shed`, answered through `podium.edge.early`).
"""

from __future__ import annotations

from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podium.edge import head as edge_head
from podium.edge.early import early_answer_protocol
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
    return early_answer_protocol(bounded, shed)
