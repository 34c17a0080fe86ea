"""The gateway's routing decisions after a failed attempt, and its admission bound: pure, no I/O."""

from __future__ import annotations

import pytest

from podium.errors import Overloaded, Unavailable
from podium.gateway.admission import Admission
from podium.gateway.retry import Attempts, Target
from podium.routes.stats import VersionStats
from podium.routes.table import Endpoint, RouteTable, declared_bound

BOUND = 2


class Routes:
    """iris v1 (stable, `latest`) with two instances and v2 (canary) with one, split 90/10."""

    def __init__(self) -> None:
        self.table, self.stats = RouteTable(), VersionStats()
        self.admission = Admission(self.stats, BOUND)
        self.v1a, self.v1b = Endpoint("v1-a", "http://a"), Endpoint("v1-b", "http://b")
        self.v2 = Endpoint("v2-a", "http://c")
        for version, endpoint in (("1", self.v1a), ("1", self.v1b), ("2", self.v2)):
            self.table.add_endpoint("iris", version, endpoint)
        self.table.set_split("iris", {"1": 90, "2": 10})
        self.table.set_alias("iris", "latest", "1")

    def attempts(self, version: str | None = None, max_attempts: int = 3) -> Attempts:
        return Attempts(self.table, self.admission, self.stats, "iris", version,
                        max_attempts=max_attempts)


@pytest.fixture
def routes() -> Routes:
    return Routes()


def test_a_version_whose_every_instance_is_at_the_bound_is_shed_at_once(routes: Routes) -> None:
    routes.v1a.num_in_flight = BOUND
    assert routes.attempts("1").first().endpoint is routes.v1b  # one still has room
    routes.v1b.num_in_flight = BOUND
    with pytest.raises(Overloaded, match=r"every instance of iris@1 has 2 requests in flight") \
            as caught:
        routes.attempts("1").first()
    assert caught.value.retry_after_s == 1.0
    # the canary still has room: only the version routed to is shed, and counted as such
    assert routes.attempts("2").first().endpoint is routes.v2
    assert routes.stats.shed == {("iris", "1", "gateway"): 1}
    # shed requests are no evidence about the version: the analysis never sees them
    assert routes.stats.health("iris", "1", since_ms=0).num_requests == 0


def test_a_canary_failure_goes_once_to_the_stable_version(routes: Routes) -> None:
    attempts = routes.attempts()
    retry = attempts.after_failure(Target("2", routes.v2))
    assert retry is not None and retry.version == "1" and retry.endpoint in (routes.v1a,
                                                                            routes.v1b)
    assert attempts.after_failure(Target("2", routes.v2)) is None  # once per request
    assert routes.stats.retried == {("iris", "2", "canary"): 1}


@pytest.mark.parametrize("case", [
    "client-named-the-version", "stable-version-failed", "not-idempotent", "no-latest-alias",
    "stable-has-no-ready-instance",
])
def test_a_failure_is_the_answer_when_resending_is_not_safe_or_not_useful(
        routes: Routes, case: str) -> None:
    failed, asked = Target("2", routes.v2), None
    if case == "client-named-the-version":
        asked = "2"
    elif case == "stable-version-failed":
        failed = Target("1", routes.v1a)
    elif case == "not-idempotent":
        routes.v2.idempotent = False
    elif case == "no-latest-alias":
        routes.table = RouteTable()
        routes.table.add_endpoint("iris", "1", routes.v1a)
        routes.table.add_endpoint("iris", "2", routes.v2)
        routes.table.set_split("iris", {"1": 50, "2": 50})
    else:
        routes.v1a.healthy = False
        routes.v1b.draining = True
    assert routes.attempts(asked).after_failure(failed) is None
    assert routes.stats.retried == {}


def test_a_canary_failure_with_the_stable_version_at_the_bound_is_shed_not_a_5xx(
        routes: Routes) -> None:
    routes.v1a.num_in_flight = routes.v1b.num_in_flight = BOUND
    with pytest.raises(Overloaded):
        routes.attempts().after_failure(Target("2", routes.v2))
    assert routes.stats.shed == {("iris", "1", "gateway"): 1}


def test_an_instance_that_shed_a_request_hands_it_to_a_sibling_with_room_once(
        routes: Routes) -> None:
    attempts = routes.attempts("1")
    retry = attempts.after_overloaded(Target("1", routes.v1a))
    assert retry == Target("1", routes.v1b)
    # the sibling shed it too: the client gets that 429, counted as shed by the instance
    assert attempts.after_overloaded(retry) is None
    assert routes.stats.retried == {("iris", "1", "overloaded"): 1}
    assert routes.stats.shed == {("iris", "1", "instance"): 1}


def test_an_instance_429_is_relayed_when_no_sibling_has_room(routes: Routes) -> None:
    routes.v1b.num_in_flight = BOUND
    assert routes.attempts("1").after_overloaded(Target("1", routes.v1a)) is None
    # never to the other version: a shed request keeps its version
    assert routes.attempts("2").after_overloaded(Target("2", routes.v2)) is None
    assert routes.stats.shed == {("iris", "1", "instance"): 1, ("iris", "2", "instance"): 1}


def test_a_refused_connection_moves_on_until_max_attempts(routes: Routes) -> None:
    attempts = routes.attempts("1", max_attempts=2)
    nxt = attempts.after_not_sent(Target("1", routes.v1a), "refused")
    assert nxt == Target("1", routes.v1b) and routes.v1a.healthy is False
    with pytest.raises(Unavailable, match="no instance of iris accepted a connection after 2"):
        attempts.after_not_sent(nxt, "refused")


def test_a_package_that_declares_its_queue_sets_its_instances_bound(routes: Routes) -> None:
    routes.v2.max_in_flight = routes.v2.num_in_flight = 5  # above the flag's 2: the package's
    with pytest.raises(Overloaded, match=r"has 5 requests in flight .*package's queue limits"):
        routes.attempts("2").first()
    routes.v2.num_in_flight = 4
    assert routes.attempts("2").first().endpoint is routes.v2


@pytest.mark.parametrize(("manifest", "bound"), [
    ({"backend": "vllm", "max_num_queued_reqs": 32}, 32),
    ({"backend": "vllm", "max_num_queued_reqs": None}, None),
    ({"backend": "xgboost", "max_batch_size": 8, "dynamic_batching": {"max_queue": 100}}, 108),
    ({"backend": "python", "max_batch_size": 0, "dynamic_batching": {"max_queue": 10}}, 11),
    ({"backend": "onnx", "max_batch_size": 8, "dynamic_batching": None}, None),
    ({"backend": "torch", "dynamic_batching": {"max_queue": True}}, None),
    ({}, None),
], ids=["vllm", "vllm-undeclared", "classic", "classic-unbatched", "no-batcher", "bool",
        "stored-before-the-field"])
def test_the_bound_a_manifest_declares(manifest: dict, bound: int | None) -> None:
    assert declared_bound(manifest) == bound
