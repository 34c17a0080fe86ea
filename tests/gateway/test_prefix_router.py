"""The prefix router as a pure policy over a fake instance set: affinity, load, churn, eviction."""

from __future__ import annotations

from collections import Counter

import pytest

from podium.errors import InvalidArgument
from podium.gateway.prefix_key import BLOCK_CHARS, PrefixKey
from podium.gateway.prefix_router import AFFINITY, COLD, YIELDED, PrefixPolicy, PrefixRouter
from podium.routes.table import Endpoint, RouteTable

BOUND = 16
SLACK = 4


def prompt(system: str, user: str = "hi") -> PrefixKey:
    """A chat-like prompt: a long system prompt (8 blocks) then a short user turn."""
    return PrefixKey(system * (8 * BLOCK_CHARS // len(system)) + user * BLOCK_CHARS)


class Pool:
    """One model@version's instances in a real route table, and a router picking among them."""

    def __init__(self, *ids: str, **policy: int) -> None:
        self.table = RouteTable()
        self.router = PrefixRouter(PrefixPolicy(balance_slack=SLACK, **policy))
        self.picks: list[str] = []
        for endpoint_id in ids:
            self.add(endpoint_id)

    def add(self, endpoint_id: str) -> Endpoint:
        endpoint = Endpoint(endpoint_id, f"http://{endpoint_id}")
        self.table.add_endpoint("llm", "1", endpoint)
        return endpoint

    def __getitem__(self, endpoint_id: str) -> Endpoint:
        return self.table.endpoint(endpoint_id)

    def pick(self, key: PrefixKey) -> str:
        """The instance the table resolves a request with prefix `key` to."""
        def has_room(e: Endpoint) -> bool:
            return e.num_in_flight < BOUND

        choose = self.router.chooser("llm", key, has_room,
                                     lambda _m, _v, outcome: self.picks.append(outcome))
        return self.table.resolve("llm", "1", choose=choose)[1].id


def test_requests_sharing_a_system_prompt_stay_on_one_instance() -> None:
    pool = Pool("a", "b", "c")
    first = pool.pick(prompt("You are a pirate. ", "q0"))
    for i in range(1, 10):
        # the instance holding the prefix is busier than the others, but within the slack
        pool[first].num_in_flight = i % (SLACK + 1)
        assert pool.pick(prompt("You are a pirate. ", f"q{i}")) == first
    assert pool.picks == [COLD] + [AFFINITY] * 9


def test_different_prefixes_spread_over_the_instances() -> None:
    pool = Pool("a", "b", "c")
    systems = [f"System prompt number {n}. " for n in range(6)]
    firsts = [pool.pick(prompt(s)) for s in systems]
    assert Counter(firsts) == {"a": 2, "b": 2, "c": 2}  # a cold prefix goes where least is cached
    # and each keeps its instance afterwards
    assert [pool.pick(prompt(s, "again")) for s in systems] == firsts


def test_a_conversation_follows_its_history() -> None:
    pool = Pool("a", "b")
    turn = "user: tell me a long story about the sea and its ships. " * 10
    where = pool.pick(PrefixKey(turn))
    pool.pick(PrefixKey("another conversation entirely, nothing shared. " * 10))
    assert pool.pick(PrefixKey(turn + "assistant: once upon a time... user: more")) == where


def test_affinity_yields_to_load_past_the_slack() -> None:
    pool = Pool("a", "b")
    held = pool.pick(prompt("Shared context. "))
    other = "b" if held == "a" else "a"
    pool[held].num_in_flight = SLACK  # exactly at the slack: still affinity
    assert pool.pick(prompt("Shared context. ", "x")) == held
    pool[held].num_in_flight = SLACK + 1
    assert pool.pick(prompt("Shared context. ", "y")) == other
    assert pool.picks[-2:] == [AFFINITY, YIELDED]
    # the instance that took it now holds the prefix too: with load even, either serves it
    pool[held].num_in_flight = 0
    pool[other].num_in_flight = 1
    assert pool.pick(prompt("Shared context. ", "z")) == held


def test_an_instance_at_its_in_flight_bound_is_never_picked_for_its_cache() -> None:
    pool = Pool("a", "b")
    held = pool.pick(prompt("Bound test. "))
    other = "b" if held == "a" else "a"
    pool[held].num_in_flight = BOUND
    pool[other].num_in_flight = BOUND - 1  # within the slack of it: only the bound rules it out
    assert pool.pick(prompt("Bound test. ", "x")) == other
    pool[other].num_in_flight = BOUND
    # everyone full: least in-flight answers and the admission sheds, nothing is recorded
    before = (pool.router.num_blocks(pool["a"]), pool.router.num_blocks(pool["b"]))
    pool.pick(prompt("Bound test. ", "y"))
    assert (pool.router.num_blocks(pool["a"]), pool.router.num_blocks(pool["b"])) == before


def test_unhealthy_draining_and_removed_instances_lose_their_index() -> None:
    pool = Pool("a", "b", "c", "d", "e")
    held = {name: pool.pick(prompt(name)) for name in ("First. ", "Second. ", "Third. ")}
    assert len(set(held.values())) == 3
    pool[held["First. "]].healthy = False
    pool[held["Second. "]].draining = True
    pool.table.remove_endpoint(held["Third. "])
    spares = {"a", "b", "c", "d", "e"} - set(held.values())
    survivor = pool.pick(prompt("Unrelated. "))
    assert survivor in spares
    assert pool.router.indexed() == [survivor]
    # back in service, the instance that was unhealthy starts empty: its old prefix is cold
    pool[held["First. "]].healthy = True
    pool.picks.clear()
    pool.pick(prompt("First. ", "after"))
    assert pool.picks == [COLD]


def test_an_instance_restarted_under_the_same_id_starts_empty() -> None:
    pool = Pool("a", "b")
    held = pool.pick(prompt("Before the restart. "))
    other = "b" if held == "a" else "a"
    # the table swaps in a new endpoint object between two picks (a rollout, a restart)
    routes = pool.table.routes()
    splits, aliases, endpoints = routes["llm"]
    endpoints["1"] = [Endpoint(held, f"http://{held}-new") if e.id == held else e
                      for e in endpoints["1"]]
    pool.table.replace({"llm": (splits, aliases, endpoints)})
    assert pool.router.num_blocks(pool[held]) == 0
    pool.picks.clear()
    pool[other].num_in_flight = 1  # the cold pick then goes to the restarted one, by load
    assert pool.pick(prompt("Before the restart. ", "x")) == held
    assert pool.picks == [COLD]


def test_a_new_instance_takes_new_prefixes_and_leaves_held_ones_where_they_are() -> None:
    pool = Pool("a", "b")
    held = {s: pool.pick(prompt(s)) for s in ("One. ", "Two. ")}
    pool.add("c")
    assert pool.pick(prompt("Three. ")) == "c"  # nothing cached there yet
    assert {s: pool.pick(prompt(s, "again")) for s in held} == held


def test_the_least_recently_sent_prefix_is_evicted_past_the_capacity() -> None:
    blocks = len(prompt("Evict me. ", "a").blocks)
    pool = Pool("a", "b", capacity_blocks=2 * blocks)
    held = pool.pick(prompt("Evict me. ", "a"))
    pool["b" if held == "a" else "a"].num_in_flight = SLACK  # keep everything on `held`
    pool.pick(prompt("Keep me. ", "a"))
    pool.pick(prompt("Evict me. ", "a"))  # touched again: now the most recent
    pool.pick(prompt("Newcomer. ", "a"))  # pushes out the least recent: "Keep me."
    pool.picks.clear()
    pool.pick(prompt("Evict me. ", "a"))
    pool.pick(prompt("Keep me. ", "a"))
    assert pool.picks == [AFFINITY, COLD]
    assert pool.router.num_blocks(pool[held]) <= 2 * blocks


def test_only_the_leading_blocks_that_match_count() -> None:
    pool = Pool("a", "b")
    base = "shared header. " * 20
    long_match = pool.pick(PrefixKey(base + "branch one " * 40))
    pool["b" if long_match == "a" else "a"].num_in_flight = 0
    short = pool.pick(PrefixKey("different start. " + base))  # same text, not a prefix
    assert pool.picks[-1] == COLD
    assert short != long_match


def test_one_instance_and_prompts_without_a_full_block_are_left_to_least_in_flight() -> None:
    pool = Pool("a")
    assert pool.pick(prompt("Alone. ")) == "a"
    pool.add("b")
    pool.pick(PrefixKey("short"))
    assert pool.picks == []
    assert pool.router.indexed() == []


@pytest.mark.parametrize("field,value", [("capacity_blocks", 0), ("balance_slack", -1)])
def test_a_bad_policy_names_its_field(field: str, value: int) -> None:
    with pytest.raises(InvalidArgument, match=f"{field}={value}"):
        PrefixPolicy(**{field: value})


def test_a_partly_evicted_prefix_keeps_its_leading_blocks() -> None:
    # as in vLLM, a prefix's tail goes first: what is left still matches from the start
    blocks = len(prompt("Partly. ", "a").blocks)
    pool = Pool("a", "b", capacity_blocks=blocks + blocks // 2)
    held = pool.pick(prompt("Partly. ", "a"))
    pool["b" if held == "a" else "a"].num_in_flight = SLACK
    pool.pick(prompt("Pushes half of it out. ", "a"))
    pool.picks.clear()
    assert pool.pick(prompt("Partly. ", "a")) == held
    assert pool.picks == [AFFINITY]
