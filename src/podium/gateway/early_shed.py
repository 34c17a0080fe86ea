"""The gateway's cheapest answer: a KServe or pipeline request certain to be shed is refused from
its head.

At several times an instance's capacity most requests are refusals. A refusal that takes the
full path (a task, the ASGI cycle, the body read, routing, the 429 rendered and sent through
uvicorn) costs the gateway's one event loop nearly what forwarding does, so at 4x capacity the
refusals alone saturate it and every request, admitted or not, waits behind them
(`bench/overload_xgb.py`). The HTTP protocol (`gateway.http_server`) asks `EarlyShed` as soon as
a request's head is parsed: when the path names a KServe model (`/v2/models/...`) or a pipeline
(`/pipelines/NAME[/versions/V]`, routed like KServe) whose every ready instance is at its bound
(`RouteTable.saturation`), the answer is the 429 the full path would give (counted as
shed the same way, the same body and `Retry-After`), written by the protocol itself, and the
request's body is dropped as it arrives.
The rendered 429 is kept per path and message (the same refusal is given thousands of times a
second in a burst; a new bound or count renders anew), so a refusal costs the routing check,
the count and the write. Where one version could be picked (the common case: a model with one
version, or a version named) the check itself says which instance refused it
(`RouteTable.saturation`), and the shed is counted without routing the request: no attempt, no
turn of the round robin, no exception raised. At 4x a classic model's capacity most of the
gateway's core goes to refusals, and every microsecond of one is taken from the admitted
requests on the same core (`bench/overload_xgb.py`).

A request the check lets through is counted against the instance it most likely goes to
until the end of the event loop's turn (`_passing`): it is counted in flight only when its
task runs, in the next turn, and every head parsed before then would otherwise see the same
room. At 4x capacity a read brings several heads at once, and a third of the spike's refusals
were taking the full path that way (each a task, a routing and a rendered error, ~5x an early
refusal's CPU).

Only a certain refusal is answered early; everything else takes the full path: an OpenAI
request (its model is in the body), a request whose key does not pass (its answer is the 401),
a body over the gateway's limit (its answer is the 413), and any request that might be
forwarded.
"""

from __future__ import annotations

import asyncio

from podium.auth import instance_role
from podium.auth_keys import Access
from podium.errors import Overloaded
from podium.gateway.asgi import Answer, Headers, error_answer
from podium.gateway.proxy import Gateway
from podium.gateway.request_route import KSERVE_PATH, PIPELINE_PATH
from podium.gateway.retry import Attempts
from podium.routes.table import Endpoint

MAX_KEPT = 256
"""Rendered refusals kept (model, version and bound vary little: past it they are dropped)."""


class EarlyShed:
    """`(method, path, headers) -> the 429 to answer now, or None`: for `http_server`."""

    def __init__(self, gateway: Gateway, access: Access | None = None) -> None:
        self.gateway = gateway
        self.access = access if access is not None and access.guarded else None
        self._answers: dict[tuple[str, str], Answer] = {}
        """Rendered refusals by (path, message)."""
        self._passed: dict[str, int] = {}
        """Requests let through to the app in this turn of the event loop, by instance id."""
        self._roomy: Endpoint | None = None

    def __call__(self, method: str, path: str, headers: Headers) -> Answer | None:
        if method != "POST":
            return None
        if path.startswith("/v2/models/"):
            match = KSERVE_PATH.match(path)
        elif path.startswith("/pipelines/"):
            match = PIPELINE_PATH.match(path)
        else:
            return None
        if match is None or not self._plain(path, headers):
            return None
        gateway = self.gateway
        model, version = match["model"], match["version"]
        self._roomy = None
        full = gateway.table.saturation(model, version, self._has_room)
        if full is None:
            if self._roomy is not None:
                self._passing(self._roomy)
            return None
        if full.endpoint is not None:  # one version, so no turn of the split decides the count
            assert full.version is not None
            return self._refusal(path, gateway.admission.refuse(model, full.version,
                                                                full.endpoint))
        attempts = Attempts(gateway.table, gateway.admission, gateway.stats, model, version,
                            max_attempts=gateway.max_attempts)
        try:  # several versions: the split's turn picks the one the shed counts for
            attempts.first()  # raises, counting the shed, unless the table just changed
        except Overloaded as exc:
            return self._refusal(path, exc)
        return None

    def _has_room(self, endpoint: Endpoint) -> bool:
        """`Admission.has_room`, counting the requests let through in this turn; the first
        instance with room is kept (`_roomy`: where the request is counted if let through)."""
        admission = self.gateway.admission
        room = endpoint.load + self._passed.get(endpoint.id, 0) < admission.bound(endpoint)
        if room and self._roomy is None:
            self._roomy = endpoint
        return room

    def _passing(self, endpoint: Endpoint) -> None:
        """A request goes on to the app, most likely to `endpoint` (the only one, or one with
        room): counted there until its task has run (the turn after this one)."""
        if not self._passed:
            asyncio.get_running_loop().call_soon(self._passed.clear)
        self._passed[endpoint.id] = self._passed.get(endpoint.id, 0) + 1

    def _refusal(self, path: str, exc: Overloaded) -> Answer:
        """`error_answer(path, exc)`, rendered once per path and message."""
        key = (path, str(exc))
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= MAX_KEPT:
                self._answers.clear()
            answer = self._answers[key] = error_answer(path, exc)
        return answer

    def _plain(self, path: str, headers: Headers) -> bool:
        """Whether nothing but the overload decides this request's answer: its key passes and
        its declared body is within the limit."""
        authorization = length = None
        for name, value in headers:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = value
        if length is not None and not (length.isdigit()
                                       and int(length) <= self.gateway.limits.max_body_bytes):
            return False
        return self.access is None or self.access.allows(instance_role(path) or "",
                                                         authorization)
