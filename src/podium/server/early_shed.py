"""The instance's cheapest refusal: an OpenAI request to a full engine is answered 429 from its
head, before its body is read, parsed or validated (`podium.edge.early`).

In a burst several times the engine's capacity, most requests are refusals, and the engine's
own output handling (every running stream's tokens, detokenized) already keeps the one event
loop busy. Through the app a refusal costs a task, the middleware, the body read and parsed,
routing and the rendered error; from the head it costs vLLM's admission check
(`AsyncLLM.check_admission`, the same one `VllmOpenAI.admit` runs first) and one write.
The answer is the 429 the full path gives, byte for byte (`Retry-After`, the OpenAI error
naming the bound), logged and counted as any request is.

Only a certain refusal is answered early, on an instance serving one model over the route
(and no LoRA adapters of it, whose requests name the adapter in their body):
the request's key must pass (else its answer is the 401), its declared body must be within the
limit (else the 413), its `X-Request-Timeout` must parse (else the 400). While the engine is
full, a body the full path would refuse with a 400 (or naming another model: a 404) is answered
429 instead, as the full path already answers before it validates the body.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from podium.auth import INFERENCE
from podium.backends import deadline
from podium.backends.openai_service import ROUTES, OpenAIRoute
from podium.edge.head import Headers
from podium.errors import InvalidArgument, PodiumError
from podium.errors.render import json_error, retry_after
from podium.metrics import request_log
from podium.server.instance import Instance

_BY_PATH = {route.path: route for route in ROUTES}


@dataclass
class Refusal:
    """A 429 written from the head, and what its log line says."""

    status: int
    headers: Headers
    body: bytes
    context: request_log.RequestContext = field(repr=False)


class InstanceShed:
    """`(method, path, headers) -> the 429 to answer now, or None`: for `edge.early`."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        access = instance.config.access()
        self.access = access if access.guarded else None
        self.max_body_bytes = instance.config.max_body_bytes

    def __call__(self, method: str, path: str, headers: Headers) -> Refusal | None:
        if method != "POST":
            return None
        route = _BY_PATH.get(path)
        if route is None or self.instance.frontends != "embedded":
            return None
        request_id = None
        authorization = length = timeout = None
        for name, value in headers:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = value
            elif name == b"x-request-timeout":
                timeout = value
            elif name == b"x-request-id":
                request_id = value
        if length is not None and not (length.isdigit()
                                       and int(length) <= self.max_body_bytes):
            return None
        if self.access is not None and not self.access.allows(INFERENCE, authorization):
            return None
        if timeout is not None and not _parses(timeout):
            return None
        return self._refusal(route, path, request_id)

    def _refusal(self, route: OpenAIRoute, path: str, request_id: bytes | None
                 ) -> Refusal | None:
        served = [e for e in self.instance.repository.ready_entries()
                  if e.backend.openai is not None and e.backend.openai.serves(route)]
        if len(served) != 1:  # the body names the model: only one model makes it certain
            return None
        entry = served[0]
        if entry.backend.serves_adapters:  # the body may name an adapter: its 429 is counted
            return None                    # for the adapter, on the full path
        refusal = entry.backend.openai.refusal(route)  # type: ignore[union-attr]
        if refusal is None:
            return None
        context = request_log.RequestContext(
            request_id=request_log.request_id_from(
                request_id.decode("latin-1") if request_id else None),
            method="POST", path=path, protocol="openai", endpoint=route.path,
            model=entry.name, version=entry.version)
        return _answer(refusal, context)


def _parses(value: bytes) -> bool:
    try:
        deadline.parse(value.decode("latin-1"))
    except InvalidArgument:
        return False
    return True


def _answer(refusal: PodiumError, context: request_log.RequestContext) -> Refusal:
    status, body = json_error("openai", refusal, context.request_id)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if (seconds := retry_after(refusal)) is not None:
        headers.append((b"retry-after", seconds.encode()))
    headers.append((request_log.HEADER.encode(), context.request_id.encode()))
    context.status = status
    return Refusal(status, headers, body, context)


def answered(answer: Refusal) -> None:
    """Once the 429 is written: its log line and its count, as the middleware writes them."""
    from podium.metrics import server

    context = answer.context
    context.latency_s = time.perf_counter() - context.started
    request_log.log_request(context)
    server.observe_request("openai", context.endpoint or "", context.model or "",
                           context.version or "", context.status or 429, context.latency_s)
