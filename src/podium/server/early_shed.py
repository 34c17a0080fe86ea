"""The instance's cheapest refusal: an LLM request to a full engine is answered 429 from its
head, before its body is read, parsed or validated (`podium.edge.early`).

In a burst several times the engine's capacity, most requests are refusals, and the engine's
own output handling (every running stream's tokens, detokenized) already keeps the one event
loop busy. Through the app a refusal costs a task, the middleware, the body read and parsed,
routing and the rendered error; from the head it costs vLLM's admission check
(`AsyncLLM.check_admission`, the same one `VllmOpenAI.admit` runs first) and one write.
The answer is the 429 the full path gives, byte for byte (`Retry-After`, the error naming the
bound, OpenAI's or Triton's shape), logged and counted for the model the full path names.

Which requests: the OpenAI routes on an instance serving one model over the route, and the
KServe v2 inference routes (`/v2/models/{m}[/versions/{v}]/infer|generate|generate_stream`),
whose path names the model, a LoRA adapter included (`Backend.refusal`: a model without an
engine never refuses here). An OpenAI body may name an adapter of the model, whose 429 is the
adapter's (`podium:requests`, the request log): for a model serving adapters the refusal is
still decided and written from the head, but its body is kept as it arrives (`keeps_body`,
`edge.early`) and read once the answer is written, for the model its line and count name.

Only a certain refusal is answered early: the request's key must pass (else its answer is the
401), its declared body must be within the limit (else the 413), its `X-Request-Timeout` must
parse (else the 400), and a KServe path must name a ready model (else its 404 / 503). While the
engine is full, a body the full path would refuse with a 400 (or an OpenAI body naming another
model: a 404) is answered 429 instead, as the full path already answers before it validates the
body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from podium.auth import INFERENCE
from podium.backends import deadline
from podium.backends.openai_service import ROUTES, OpenAIRoute
from podium.edge.head import Headers
from podium.errors import InvalidArgument, PodiumError
from podium.errors.render import Shape, json_error, retry_after
from podium.metrics import request_log
from podium.repository import ModelEntry
from podium.server.instance import Instance

if TYPE_CHECKING:
    from podium.metrics.server import Protocol

_BY_PATH = {route.path: route for route in ROUTES}
_KSERVE_ACTIONS = frozenset({"infer", "generate", "generate_stream"})


@dataclass
class Refusal:
    """A 429 written from the head, and what its log line says."""

    status: int
    headers: Headers
    body: bytes
    context: request_log.RequestContext = field(repr=False)
    protocol: Protocol = "openai"
    keeps_body: int = 0
    """> 0: the request's body (up to this many bytes) is wanted, for `named`."""
    request_body: bytes | None = field(default=None, repr=False)
    """Set by `edge.early` once the body has arrived (None when it was longer)."""
    named: Callable[[bytes | None], None] | None = field(default=None, repr=False)
    """Given the body: sets the context's model and version to the ones it names."""


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
        kserve = kserve_route(path) if route is None else None
        if ((kserve is None and (route is None or self.instance.frontends != "embedded"))
                or self.instance.draining):
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
        if kserve is not None:
            return self._kserve_refusal(kserve, path, request_id)
        return self._refusal(route, path, request_id)  # type: ignore[arg-type]

    def _refusal(self, route: OpenAIRoute, path: str, request_id: bytes | None
                 ) -> Refusal | None:
        served = [e for e in self.instance.repository.ready_entries()
                  if e.backend.openai is not None and e.backend.openai.serves(route)]
        if len(served) != 1:  # the body names the model: only one model makes it certain
            return None
        entry = served[0]
        refusal = entry.backend.openai.refusal(route)  # type: ignore[union-attr]
        if refusal is None:
            return None
        context = request_log.RequestContext(
            request_id=request_log.request_id_from(
                request_id.decode("latin-1") if request_id else None),
            method="POST", path=path, protocol="openai", endpoint=route.path,
            model=entry.name, version=entry.version)
        answer = _answer(refusal, context)
        if entry.backend.serves_adapters:  # the body may name an adapter: counted for it
            answer.keeps_body = self.max_body_bytes
            answer.named = lambda body: self._name_adapter(entry, context, body)
        return answer

    def _name_adapter(self, base: ModelEntry, context: request_log.RequestContext,
                      body: bytes | None) -> None:
        """The context names the adapter of `base` the body's `model` names, as the full path
        would; the base when it names none of them (or the body is not JSON)."""
        model = _model_of(body)
        if model is None:
            return
        name, at, version = model.partition("@")
        try:
            entry = self.instance.repository.find(name, version if at else None)
        except PodiumError:
            return
        if entry.parent is base:
            context.model, context.version = entry.name, entry.version

    def _kserve_refusal(self, route: KServeRoute, path: str, request_id: bytes | None
                        ) -> Refusal | None:
        repository = self.instance.repository
        # each engine asked once (vLLM counts every refusal of its check in its own metrics)
        full = {id(e): refusal for e in repository.ready_entries()
                if (refusal := e.backend.refusal()) is not None}
        if not full:
            return None  # no engine is full: the common case, answered before any lookup
        try:  # the model the full path would lease (an adapter's own entry for an adapter)
            entry = repository.find(route.model, route.version)
        except PodiumError:
            return None  # its 404 / 503, on the full path
        refusal = full.get(id(entry.parent or entry))  # an adapter runs on its base's engine
        if not entry.ready or refusal is None:
            return None
        context = request_log.RequestContext(
            request_id=request_log.request_id_from(
                request_id.decode("latin-1") if request_id else None),
            method="POST", path=path, protocol="kserve_http", endpoint=route.endpoint,
            model=entry.name, version=entry.version)
        # Triton's statistics count it as the full path does: a failed request of the model
        entry.stats.record(ok=False, duration_ns=0, batch_size=1)
        return _answer(refusal, context, "kserve")


@dataclass(frozen=True)
class KServeRoute:
    """A KServe v2 inference path: the model (and version) it names, its route template."""

    model: str
    version: str | None
    endpoint: str


def kserve_route(path: str) -> KServeRoute | None:
    """`/v2/models/{model}[/versions/{version}]/{infer|generate|generate_stream}`, or None."""
    if not path.startswith("/v2/models/"):
        return None
    parts = path.split("/")
    if len(parts) == 5:
        _, _, _, model, action = parts
        version = None
    elif len(parts) == 7 and parts[4] == "versions":
        _, _, _, model, _, version, action = parts
    else:
        return None
    if action not in _KSERVE_ACTIONS or not model or version == "":
        return None
    template = "/v2/models/{model}" if version is None else "/v2/models/{model}/versions/{version}"
    return KServeRoute(model, version, f"{template}/{action}")


def _model_of(body: bytes | None) -> str | None:
    """An OpenAI body's `model`, or None (no body, not JSON, no model)."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:  # not JSON (nor UTF-8): the full path's 400, counted for the base
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) and model else None


def _parses(value: bytes) -> bool:
    try:
        deadline.parse(value.decode("latin-1"))
    except InvalidArgument:
        return False
    return True


def _answer(refusal: PodiumError, context: request_log.RequestContext,
            shape: Shape = "openai") -> Refusal:
    status, body = json_error(shape, refusal, context.request_id)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if (seconds := retry_after(refusal)) is not None:
        headers.append((b"retry-after", seconds.encode()))
    headers.append((request_log.HEADER.encode(), context.request_id.encode()))
    context.status = status
    return Refusal(status, headers, body, context,
                   "kserve_http" if shape == "kserve" else "openai")


def answered(answer: Refusal) -> None:
    """Once the 429 is written: its log line and its count, as the middleware writes them."""
    from podium.metrics import server

    context = answer.context
    context.latency_s = time.perf_counter() - context.started
    if answer.named is not None:
        answer.named(answer.request_body)
    request_log.log_request(context)
    server.observe_request(answer.protocol, context.endpoint or "", context.model or "",
                           context.version or "", context.status or 429, context.latency_s)
