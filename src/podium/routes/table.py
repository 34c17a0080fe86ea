"""Where a request goes: model → version (explicit, alias or weighted split) → instance.

Pure and synchronous: the control plane changes splits, aliases and endpoints live; the proxy
asks `pick` once per attempt. Versions are chosen by smooth weighted round robin, so a 10% split
sends exactly 1 request in 10, not 10% on average; instances by least in-flight requests.

A LoRA adapter is a model of its own here (its splits, aliases, versions), with no instances of
its own: each version *placed* (`set_adapter`) is served by the instances of its base model,
whichever base versions run (the control plane only keeps base versions that fit its adapters).
Which base version takes an adapter request follows the base's split, and its answer counts for
that base version's analysis too (`counted_for`): a base rollout moves and judges the adapter
traffic it carries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from podium.errors import NotFound, Unavailable

LATEST = "latest"
Adapter = tuple[str, list[str]]
"""A LoRA adapter's routing: its base model and its versions placed on the base's instances."""
Routes = tuple[dict[str, int], dict[str, str], dict[str, list["Endpoint"]]]
"""One model's splits, aliases and endpoints per version, as `RouteTable.replace` takes them."""
Choose = Callable[[str, list["Endpoint"], list["Endpoint"]], "Endpoint | None"]
"""A request's own pick (`gateway.prefix_router`): (version, all its endpoints, the usable
ones) → one of the usable, or None for least in-flight."""


@dataclass
class Endpoint:
    """One instance of model@version the gateway may send requests to."""

    id: str
    url: str
    healthy: bool = True
    """False after a failed connection or health check; no requests until it recovers."""
    draining: bool = False
    """True once the control plane wants it stopped: no new requests, in-flight ones finish."""
    num_in_flight: int = 0
    """Requests this gateway has in flight on the instance."""
    in_flight_elsewhere: int = 0
    """Requests the other gateways of the same control plane have in flight on it, as of
    their last reports (a quarter of a second old at most; 0 while the plane is away)."""
    grpc_target: str | None = None
    """`host:port` of the instance's KServe gRPC server (None: HTTP only)."""
    max_in_flight: int | None = None
    """The bound the package's own queue limits imply (`declared_bound` below); None: the
    gateway's `--max-in-flight-per-instance`."""
    measured_bound: int | None = None
    """The in-flight bound the instance measured for itself (a classic model's
    `podium-admission-bound` answer header, `Admission.learn`); None until it sends one."""
    idempotent: bool = True
    """The package's `idempotent`: a request it failed may be sent again (to the stable
    version during a rollout); False for a model with side effects."""
    frontends: str = "embedded"
    """The package's `frontends`: a standalone instance serves KServe only, no OpenAI /v1."""

    @property
    def load(self) -> int:
        """Requests in flight on the instance from every gateway: what balancing and the
        admission bound compare."""
        return self.num_in_flight + self.in_flight_elsewhere

    @property
    def can_take(self) -> bool:
        """Whether a new request may go here."""
        return self.healthy and not self.draining


@dataclass(frozen=True)
class Saturated:
    """Every instance a request could go to is full (`RouteTable.saturation`): the version it
    is refused for and the instance `resolve` would pick there (both None: the split's turn)."""

    version: str | None
    endpoint: Endpoint | None


@dataclass
class _Model:
    splits: dict[str, int] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    endpoints: dict[str, list[Endpoint]] = field(default_factory=dict)
    wrr: dict[str, int] = field(default_factory=dict)
    turn: int = 0
    on_demand: set[str] = field(default_factory=set)
    """Versions whose instances start on demand (scaled to zero when idle): a request for one
    with no ready instance is held at the gateway while one starts (`gateway.hold`)."""
    base: str | None = None
    """A LoRA adapter's base model (None: a model with instances of its own)."""
    placed: set[str] = field(default_factory=set)
    """An adapter's versions placed on its base's instances."""
    base_wrr: dict[str, int] = field(default_factory=dict)
    """An adapter's round robin over its base's versions (its traffic follows the base's
    split)."""


class RouteTable:
    """Models, their versions' endpoints, splits and aliases; changed live by the control plane."""

    def __init__(self) -> None:
        self._models: dict[str, _Model] = {}
        self._by_id: dict[str, Endpoint] = {}
        self.held: dict[tuple[str, str], int] = {}
        """(model, version) → requests the gateways hold for it, waiting for an instance, as
        they last reported (the control plane's table; `gateway.hold`)."""
        # the control plane changes the table from its own thread while the proxy reads it
        self._lock = threading.RLock()

    # written by the control plane ------------------------------------------------------

    def set_split(self, model: str, weights: dict[str, int]) -> None:
        """Route the model's unversioned traffic by these weights."""
        with self._lock:
            entry = self._models.setdefault(model, _Model())
            entry.splits = {v: w for v, w in weights.items() if w > 0}
            entry.wrr = {v: entry.wrr.get(v, 0) for v in entry.splits}

    def set_alias(self, model: str, alias: str, version: str) -> None:
        """Point an alias (e.g. `latest`) at a version."""
        with self._lock:
            self._models.setdefault(model, _Model()).aliases[alias] = version

    def set_adapter(self, adapter: str, base: str, version: str, placed: bool) -> None:
        """Place (or remove) adapter@version on the instances of its base model."""
        with self._lock:
            entry = self._models.setdefault(adapter, _Model())
            entry.base = base
            if placed:
                entry.placed.add(version)
            else:
                entry.placed.discard(version)

    def add_endpoint(self, model: str, version: str, endpoint: Endpoint) -> None:
        """Start routing to a (ready) instance."""
        with self._lock:
            entry = self._models.setdefault(model, _Model())
            entry.endpoints.setdefault(version, []).append(endpoint)
            self._by_id[endpoint.id] = endpoint

    def remove_endpoint(self, endpoint_id: str) -> None:
        """Forget an instance (after it drained)."""
        with self._lock:
            endpoint = self._by_id.pop(endpoint_id, None)
            for entry in self._models.values():
                for endpoints in entry.endpoints.values():
                    if endpoint in endpoints:
                        endpoints.remove(endpoint)

    def set_on_demand(self, model: str, version: str, on: bool) -> None:
        """Mark a version as started on demand (its deployment may be at zero instances)."""
        with self._lock:
            entry = self._models.setdefault(model, _Model())
            if on:
                entry.on_demand.add(version)
            else:
                entry.on_demand.discard(version)

    def on_demand(self) -> dict[str, list[str]]:
        """Model → its versions started on demand (models with none left out)."""
        with self._lock:
            return {m: sorted(e.on_demand) for m, e in self._models.items() if e.on_demand}

    def replace(self, routes: dict[str, Routes],
                on_demand: Mapping[str, list[str]] | None = None,
                adapters: dict[str, Adapter] | None = None) -> None:
        """Swap in a whole table at once (a gateway process taking the control plane's): model
        → (splits, aliases, endpoints per version), the versions started on demand, adapter →
        (base, placed versions). Pass an `Endpoint` already in the table to keep it: its
        in-flight count carries over."""
        on_demand = on_demand or {}
        with self._lock:
            models: dict[str, _Model] = {}
            for name, (splits, aliases, endpoints) in routes.items():
                old = self._models.get(name)
                entry = _Model(splits={v: w for v, w in splits.items() if w > 0},
                               aliases=dict(aliases),
                               endpoints={v: list(eps) for v, eps in endpoints.items()},
                               turn=old.turn if old else 0,
                               on_demand=set(on_demand.get(name, ())))
                # the round robin's position survives, so a re-sent split stays exact
                entry.wrr = {v: old.wrr.get(v, 0) if old else 0 for v in entry.splits}
                models[name] = entry
            for name, (base, placed) in (adapters or {}).items():
                entry = models.setdefault(name, _Model())
                entry.base, entry.placed = base, set(placed)
            self._models = models
            self._by_id = {e.id: e for entry in models.values()
                           for eps in entry.endpoints.values() for e in eps}

    def routes(self) -> dict[str, Routes]:
        """The whole table in the shape `replace` takes (lists copied, endpoints shared)."""
        with self._lock:
            return {name: (dict(e.splits), dict(e.aliases),
                           {v: list(eps) for v, eps in e.endpoints.items()})
                    for name, e in self._models.items()}

    def adapters(self) -> dict[str, Adapter]:
        """Every adapter: its base model and its placed versions (sorted)."""
        with self._lock:
            return {name: (e.base, sorted(e.placed)) for name, e in self._models.items()
                    if e.base is not None}

    def base_of(self, model: str) -> str | None:
        """The base model serving `model` when it is a LoRA adapter, else None."""
        with self._lock:
            entry = self._models.get(model)
            return entry.base if entry else None

    def counted_for(self, model: str, version: str, endpoint: Endpoint
                    ) -> list[tuple[str, str]]:
        """The (model, version) pairs an answer of model@version from `endpoint` counts for
        in the rollout analysis: its own, and for a LoRA adapter also the version of its base
        that instance runs, so a base rollout is judged on the adapter requests it serves."""
        with self._lock:
            entry = self._models.get(model)
            base = self._models.get(entry.base) if entry and entry.base is not None else None
            for base_version, endpoints in (base.endpoints.items() if base else ()):
                if any(e is endpoint for e in endpoints):
                    return [(model, version), (entry.base, base_version)]  # type: ignore[union-attr]
            return [(model, version)]

    def adapter_endpoints(self, adapter: str, version: str) -> list[Endpoint]:
        """The instances serving adapter@version ([] when it is not placed)."""
        with self._lock:
            entry = self._models.get(adapter)
            return self._served(entry).get(version, []) if entry else []

    def endpoint(self, endpoint_id: str) -> Endpoint:
        """The endpoint with this id (KeyError when unknown)."""
        return self._by_id[endpoint_id]

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint."""
        with self._lock:
            return list(self._by_id.values())

    def drain(self, endpoint_id: str) -> Endpoint:
        """Stop sending new requests to an instance; its in-flight requests finish."""
        endpoint = self._by_id[endpoint_id]
        endpoint.draining = True
        return endpoint

    def routed(self) -> list[tuple[str, str, Endpoint]]:
        """(model, version, endpoint) for every endpoint."""
        with self._lock:
            return [(m, v, e) for m, entry in sorted(self._models.items())
                    for v, eps in sorted(entry.endpoints.items()) for e in eps]

    def split(self, model: str) -> dict[str, int]:
        """The model's current split (versions with weight above 0)."""
        with self._lock:
            entry = self._models.get(model)
            return dict(entry.splits) if entry else {}

    def alias(self, model: str, alias: str) -> str | None:
        """The version an alias of the model points at (None: unset)."""
        with self._lock:
            entry = self._models.get(model)
            return entry.aliases.get(alias) if entry else None

    def models(self) -> dict[str, list[str]]:
        """Model name → versions that have endpoints."""
        with self._lock:
            return {m: sorted(v for v, eps in e.endpoints.items() if eps)
                    for m, e in self._models.items()}

    # read per request ------------------------------------------------------------------

    def waiting_version(self, model: str, version: str | None) -> str | None:
        """The version a request for `model` (`version` None: by the split) goes to when that
        version is started on demand and has no instance taking requests: the request may wait
        for one. None otherwise (the usual answer stands)."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None or not entry.on_demand:
                return None
            if version is not None:
                chosen: str | None = entry.aliases.get(version, version)
            elif LATEST in entry.aliases:
                chosen = entry.aliases[LATEST]
            else:
                chosen = max(entry.splits, key=lambda v: entry.splits[v], default=None)
            if chosen is None or chosen not in entry.on_demand:
                return None
            if any(e.can_take for e in entry.endpoints.get(chosen, [])):
                return None
            return chosen

    def resolve(self, model: str, version: str | None, *,
                exclude: frozenset[str] = frozenset(),
                choose: Choose | None = None) -> tuple[str, Endpoint]:
        """The version and instance for one attempt of a request (`choose` may pick it)."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None:
                raise NotFound(f"model {model!r} is not deployed; deployed: "
                               f"{', '.join(sorted(self._models)) or 'none'}", param="model")
            served = self._served(entry)
            if version is not None:
                version = entry.aliases.get(version, version)
                if version not in served:
                    raise NotFound(f"{model}@{version} is not deployed; versions: "
                                   f"{', '.join(sorted(served)) or 'none'}",
                                   param="version")
                return version, self._instance(model, version,
                                               self._on_base_split(entry, served, exclude),
                                               exclude, choose)
            candidates = {v: w for v, w in entry.splits.items()
                          if any(e.can_take and e.id not in exclude
                                 for e in served.get(v, []))}
            if candidates:
                chosen = self._weighted(entry.wrr, candidates)
            elif LATEST in entry.aliases:
                chosen = entry.aliases[LATEST]
            elif entry.splits:
                chosen = max(entry.splits, key=lambda v: entry.splits[v])
            else:
                raise Unavailable(f"model {model!r} has no version taking traffic")
            return chosen, self._instance(model, chosen,
                                          self._on_base_split(entry, served, exclude), exclude,
                                          choose)

    def saturation(self, model: str, version: str | None,
                   has_room: Callable[[Endpoint], bool]) -> Saturated | None:
        """Whether the first attempt of a request for `model` (`version` None: by the split)
        is certain to find its instance without room: every ready instance of every version
        `resolve` could pick fails `has_room`; None when any has room, and when none is ready
        (that answer is no shed). Where only one version could be picked (named, or the only
        one of the split with a ready instance; not a LoRA adapter, whose base version follows
        a split of its own), also that version and its instance of least load, the one
        `resolve` picks (ties aside). Reads the table only: no turn of the round robin."""
        with self._lock:
            entry = self._models.get(model)
            if entry is None:
                return None
            versions = [entry.aliases.get(version, version)] if version is not None else \
                list(entry.splits)
            served = self._served(entry)
            usable = {v: [e for e in served.get(v, ()) if e.can_take] for v in versions}
            picked = [v for v, endpoints in usable.items() if endpoints]
            if not picked or any(has_room(e) for v in picked for e in usable[v]):
                return None
            if len(picked) > 1 or entry.base is not None:
                return Saturated(None, None)
            return Saturated(picked[0], min(usable[picked[0]], key=lambda e: e.load))

    @staticmethod
    def _weighted(wrr: dict[str, int], candidates: dict[str, int]) -> str:
        # smooth weighted round robin (nginx): exact proportions, interleaved
        total = sum(candidates.values())
        for version, weight in candidates.items():
            wrr[version] = wrr.get(version, 0) + weight
        chosen = max(candidates, key=lambda v: wrr[v])
        wrr[chosen] -= total
        return chosen

    def _on_base_split(self, entry: _Model, served: dict[str, list[Endpoint]],
                       exclude: frozenset[str]) -> dict[str, list[Endpoint]]:
        """For a LoRA adapter, its endpoints narrowed to one version of its base, chosen by the
        base's split: during a base rollout at 10%, 10% of the adapter's requests run on the
        new base version too, and the base's analysis sees them (`counted_for`). `served` as
        it is for a model, or when no version of the base's split can take the request."""
        base = self._models.get(entry.base) if entry.base is not None else None
        if base is None:
            return served
        candidates = {v: w for v, w in base.splits.items()
                      if any(e.can_take and e.id not in exclude for e in base.endpoints.get(v, []))}
        if not candidates:
            return served
        chosen = base.endpoints[self._weighted(entry.base_wrr, candidates)]
        return {v: chosen for v in served}

    def _served(self, entry: _Model) -> dict[str, list[Endpoint]]:
        """Endpoints per version; an adapter's placed versions share its base's instances."""
        if entry.base is None:
            return entry.endpoints
        base = self._models.get(entry.base)
        shared = [e for eps in base.endpoints.values() for e in eps] if base else []
        return {v: shared for v in entry.placed}

    def _instance(self, model: str, version: str, served: dict[str, list[Endpoint]],
                  exclude: frozenset[str], choose: Choose | None) -> Endpoint:
        entry = self._models[model]
        endpoints = served.get(version, [])
        usable = [e for e in endpoints if e.can_take and e.id not in exclude]
        if not usable:
            raise Unavailable(f"{model}@{version} has no ready instance")
        if choose is not None and (chosen := choose(version, endpoints, usable)) is not None:
            return chosen
        # least in-flight; ties go round robin so every instance is used (and checked)
        entry.turn += 1
        start = entry.turn % len(usable)
        rotated = usable[start:] + usable[:start]
        return min(rotated, key=lambda e: e.load)


def declared_bound(manifest: Mapping[str, Any]) -> int | None:
    """The in-flight bound a package's own queue limits imply; None when it declares none.

    An LLM: vLLM's `max_num_queued_reqs` (it counts waiting and running requests). A classic
    model: its batcher's `max_queue` plus one batch being run (`max_batch_size`).
    """
    if manifest.get("backend") == "vllm":
        return _positive(manifest.get("max_num_queued_reqs"))
    queue = _positive((manifest.get("dynamic_batching") or {}).get("max_queue"))
    if queue is None:
        return None
    return queue + max(1, _positive(manifest.get("max_batch_size")) or 1)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None
