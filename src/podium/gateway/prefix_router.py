"""Cache-aware choice among a version's instances: the one that most likely holds a request's
prefix in its KV cache, unless that one is busier than load allows.

Pure and synchronous, called by `RouteTable.resolve` (under the table's lock) with the
version's instances; tested with fake endpoints. The signal is the gateway's own: for every
instance, an LRU of the prompt block hashes (`prefix_key`) this gateway sent it, the
approximation of what its engine caches (SGLang's router keeps the same in a radix tree).
For one request, among the instances that take traffic and have room under the in-flight bound:

1. an instance more than `balance_slack` requests busier than the least busy one is out
   (cache affinity yields to load);
2. of the rest, the longest cached prefix wins; then fewer requests in flight; then the smaller
   index (a prefix no instance holds goes where least is cached: different prefixes spread);
   then round robin;
3. the chosen instance's index takes the request's blocks.

An instance that stops taking traffic (unhealthy, draining) or leaves the table loses its
index at the next pick of its version; an endpoint object the table did not have before (a
new instance, or one restarted under the same id) starts with an empty one. A version with a
single instance, and a request without a prefix, are left to least-in-flight.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from podium.errors import InvalidArgument
from podium.gateway.prefix_key import PrefixKey
from podium.routes.table import Choose, Endpoint

AFFINITY, YIELDED, COLD = "affinity", "yielded", "cold"
"""How a pick went (the `outcome` of `podium:gateway_prefix_picks`): to the instance with the
longest cached prefix; away from it for load; or no instance held any of the prefix."""
MAX_INDEXES = 1024
"""Instances indexed at once; past it the one picked longest ago is forgotten."""


@dataclass(frozen=True)
class PrefixPolicy:
    """How much the gateway remembers per instance, and how much load affinity may cost."""

    capacity_blocks: int = 8192
    """Blocks remembered per instance, least recently sent dropped first: 1 MiB of prompt
    text, about 250k tokens (a GPU's KV cache of a mid-size model; more than a CPU's)."""
    balance_slack: int = 8
    """Most requests in flight an instance may have above the least busy one and still be
    picked for its cache."""

    def __post_init__(self) -> None:
        if not 1 <= self.capacity_blocks <= 1 << 24:
            raise InvalidArgument(f"capacity_blocks={self.capacity_blocks} is out of range; "
                                  "use 1..16777216", param="capacity_blocks")
        if not 0 <= self.balance_slack <= 1_000_000:
            raise InvalidArgument(f"balance_slack={self.balance_slack} is out of range; use "
                                  "0..1000000", param="balance_slack")


@dataclass
class _Index:
    """What this gateway sent one instance (one endpoint object): block hashes, oldest first."""

    endpoint: Endpoint
    pool: tuple[str, str]
    blocks: OrderedDict[int, None]

    def match(self, hashes: tuple[int, ...]) -> int:
        """How many leading blocks of `hashes` the instance holds."""
        num = 0
        for block in hashes:
            if block not in self.blocks:
                break
            num += 1
        return num

    def insert(self, hashes: tuple[int, ...], capacity: int) -> None:
        # the first block is the most recent: the tail of a prefix goes first, as in vLLM
        for block in reversed(hashes[:capacity]):
            if block in self.blocks:
                self.blocks.move_to_end(block)
            else:
                self.blocks[block] = None
        while len(self.blocks) > capacity:
            self.blocks.popitem(last=False)


class PrefixRouter:
    """One gateway's per-instance prefix indexes and the pick that reads them."""

    def __init__(self, policy: PrefixPolicy | None = None) -> None:
        self.policy = policy or PrefixPolicy()
        self._indexes: OrderedDict[str, _Index] = OrderedDict()
        self._pools: dict[tuple[str, str], set[str]] = {}
        self._turn = 0

    def choose(self, model: str, version: str, pool: list[Endpoint], usable: list[Endpoint],
               key: PrefixKey | None, has_room: Callable[[Endpoint], bool],
               ) -> tuple[Endpoint, str] | None:
        """The instance for a request with prefix `key` and how the pick went; None: leave it
        to least-in-flight (one instance, no prefix, or none with room: the bound sheds)."""
        self._forget_gone((model, version), pool)
        # a version of one instance has nothing to choose from: no need to hash its prompts
        # (one of two that is down still counts: what the other takes meanwhile is indexed)
        if len(pool) < 2 or key is None or not key.blocks:
            return None
        blocks = key.blocks
        matches = {e.id: self._match(e, blocks) for e in usable}
        open_ = [e for e in usable if has_room(e)]
        if not open_:
            return None
        least = min(e.load for e in open_)
        near = [e for e in open_ if e.load <= least + self.policy.balance_slack]
        self._turn += 1
        start = self._turn % len(near)
        chosen = min(near[start:] + near[:start],
                     key=lambda e: (-matches[e.id], e.load, self.num_blocks(e)))
        best = max(matches.values())
        outcome = COLD if best == 0 else AFFINITY if matches[chosen.id] == best else YIELDED
        self._record((model, version), chosen, blocks)
        return chosen, outcome

    def chooser(self, model: str, key: PrefixKey, has_room: Callable[[Endpoint], bool],
                on_pick: Callable[[str, str, str], None]) -> Choose:
        """One request's pick for `RouteTable.resolve`; `on_pick(model, version, outcome)`
        counts each pick made by prefix."""
        def choose(version: str, pool: list[Endpoint], usable: list[Endpoint]) -> Endpoint | None:
            picked = self.choose(model, version, pool, usable, key, has_room)
            if picked is None:
                return None
            on_pick(model, version, picked[1])
            return picked[0]
        return choose

    def num_blocks(self, endpoint: Endpoint) -> int:
        """Blocks this gateway remembers sending `endpoint` (0: none, or another incarnation)."""
        index = self._indexes.get(endpoint.id)
        return len(index.blocks) if index is not None and index.endpoint is endpoint else 0

    def indexed(self) -> list[str]:
        """Ids of the instances with an index, least recently picked first."""
        return list(self._indexes)

    def _match(self, endpoint: Endpoint, blocks: tuple[int, ...]) -> int:
        index = self._indexes.get(endpoint.id)
        return index.match(blocks) if index is not None and index.endpoint is endpoint else 0

    def _record(self, pool: tuple[str, str], endpoint: Endpoint,
                blocks: tuple[int, ...]) -> None:
        index = self._indexes.get(endpoint.id)
        if index is None or index.endpoint is not endpoint:
            self._drop(endpoint.id)
            index = _Index(endpoint, pool, OrderedDict())
            self._indexes[endpoint.id] = index
            self._pools.setdefault(pool, set()).add(endpoint.id)
        self._indexes.move_to_end(endpoint.id)
        index.insert(blocks, self.policy.capacity_blocks)
        while len(self._indexes) > MAX_INDEXES:
            self._drop(next(iter(self._indexes)))

    def _forget_gone(self, pool: tuple[str, str], endpoints: list[Endpoint]) -> None:
        """Drop the indexes of this version's instances that no longer take traffic."""
        routable = {e.id: e for e in endpoints if e.can_take}
        for endpoint_id in list(self._pools.get(pool, ())):
            if routable.get(endpoint_id) is not self._indexes[endpoint_id].endpoint:
                self._drop(endpoint_id)

    def _drop(self, endpoint_id: str) -> None:
        index = self._indexes.pop(endpoint_id, None)
        if index is not None:
            members = self._pools.get(index.pool, set())
            members.discard(endpoint_id)
            if not members:
                self._pools.pop(index.pool, None)
