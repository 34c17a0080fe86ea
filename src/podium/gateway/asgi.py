"""The few raw ASGI pieces the gateway needs: answer, lifespan, notice a disconnect.

The proxy speaks ASGI directly rather than through Starlette's request/response objects: on the
hot path those cost more CPU than forwarding the request upstream does.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from podium.errors.render import instance_shape, json_error, retry_after

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Answer:
    """A whole response the gateway writes itself (own routes, errors, small upstream bodies)."""

    status: int
    body: bytes
    headers: Headers = field(default_factory=list)

    @classmethod
    def json(cls, data: object, status: int = 200) -> Answer:
        """A JSON answer."""
        return cls.typed(json.dumps(data).encode(), "application/json", status)

    @classmethod
    def typed(cls, body: bytes, content_type: str, status: int = 200) -> Answer:
        """An answer with this content type and its length."""
        return cls(status, body, [(b"content-type", content_type.encode()),
                                  (b"content-length", str(len(body)).encode())])

    async def send(self, send: Send) -> None:
        """Write the whole response."""
        await send({"type": "http.response.start", "status": self.status,
                    "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def error_answer(path: str, exc: BaseException) -> Answer:
    """`exc` in the shape an instance answers on `path`, byte for byte."""
    status, body = json_error(instance_shape(path), exc)
    answer = Answer.typed(body, "application/json", status)
    if (seconds := retry_after(exc)) is not None:  # an overload says when to come back
        answer.headers.append((b"retry-after", seconds.encode()))
    return answer


async def until_disconnect(receive: Receive) -> None:
    """Return once the client has gone (or the response is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def lifespan(receive: Receive, send: Send,
                   on_shutdown: Callable[[], Awaitable[None]]) -> None:
    """Acknowledge startup; run `on_shutdown` when the server stops."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
