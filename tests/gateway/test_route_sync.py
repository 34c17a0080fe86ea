"""A gateway process's copy of the route table: taken whole from the control plane, kept when
it is away, in-flight counts and its own health verdicts carried across updates."""

from __future__ import annotations

import asyncio

import httpx

from podium.gateway.follow import ControlFollower
from podium.routes.stats import Outcome
from podium.routes.sync import (
    ENCODER,
    REPORT_DECODER,
    EndpointSpec,
    ModelSpec,
    ReportingStats,
    SyncAnswer,
    TableFollower,
    snapshot,
)
from podium.routes.table import Endpoint, RouteTable


def _answer(generation: int, *, draining: bool = False, healthy: bool = True,
            epoch: str = "e1") -> SyncAnswer:
    return SyncAnswer(epoch, generation, {"echo": ModelSpec(
        splits={"1": 50, "2": 50}, aliases={"latest": "2"},
        endpoints={"1": [EndpointSpec("echo-1-1", "http://a", "a:1", healthy, draining)],
                   "2": [EndpointSpec("echo-2-2", "http://b")]})})


def test_the_table_arrives_whole_and_routes_by_its_split() -> None:
    table = RouteTable()
    assert TableFollower(table).apply(_answer(1))
    versions = [table.resolve("echo", None)[0] for _ in range(4)]
    assert sorted(versions) == ["1", "1", "2", "2"]
    assert table.resolve("echo", "latest")[0] == "2"
    assert table.endpoint("echo-1-1").grpc_target == "a:1"


def test_an_update_keeps_in_flight_counts_and_marks_drains() -> None:
    table = RouteTable()
    follower = TableFollower(table)
    follower.apply(_answer(1))
    table.endpoint("echo-1-1").num_in_flight = 3  # requests running on it now
    assert follower.apply(_answer(2, draining=True))
    endpoint = table.endpoint("echo-1-1")
    assert (endpoint.num_in_flight, endpoint.draining) == (3, True)
    assert {table.resolve("echo", None)[0] for _ in range(6)} == {"2"}


def test_a_gateways_own_verdict_stands_until_the_control_plane_changes_its_own() -> None:
    table = RouteTable()
    follower = TableFollower(table)
    follower.apply(_answer(1))
    table.endpoint("echo-1-1").healthy = False  # this gateway's connection was refused
    follower.apply(_answer(2, draining=False))  # the control plane still says healthy
    assert table.endpoint("echo-1-1").healthy is False
    follower.apply(_answer(3, healthy=False))
    follower.apply(_answer(4, healthy=True))  # the control plane saw it recover
    assert table.endpoint("echo-1-1").healthy is True


def test_no_table_or_the_same_one_changes_nothing() -> None:
    table = RouteTable()
    follower = TableFollower(table)
    follower.apply(_answer(1))
    before = table.endpoint("echo-1-1")
    assert not follower.apply(SyncAnswer("e2", 1, None))  # a control plane still starting
    assert not follower.apply(_answer(1))
    assert table.endpoint("echo-1-1") is before and table.split("echo") == {"1": 50, "2": 50}
    assert follower.apply(_answer(1, epoch="e2"))  # a new control plane: its table wins


def test_snapshot_then_apply_is_the_same_table() -> None:
    source = RouteTable()
    source.set_split("m", {"1": 100})
    source.add_endpoint("m", "1", Endpoint("m-1-1", "http://x", grpc_target="x:2",
                                           max_in_flight=7, idempotent=False))
    source.drain("m-1-1")
    copy = RouteTable()
    TableFollower(copy).apply(SyncAnswer("e", 1, snapshot(source)))
    assert snapshot(copy) == snapshot(source)
    # what shedding and the canary retry decide by reaches every gateway process
    endpoint = copy.endpoint("m-1-1")
    assert (endpoint.max_in_flight, endpoint.idempotent) == (7, False)


def test_outcomes_wait_for_the_control_plane_and_the_table_stays() -> None:
    """Control plane down: the gateway keeps its table and its outcomes, and delivers the
    outcomes once it answers again."""
    stats, table = ReportingStats(), RouteTable()
    reports = []
    down = True

    def control(request: httpx.Request) -> httpx.Response:
        if down:
            raise httpx.ConnectError("refused")
        reports.append(REPORT_DECODER.decode(request.content))
        return httpx.Response(200, content=ENCODER.encode(_answer(7)))

    follower = ControlFollower("http://control", table, stats, gateway_id="g1")
    TableFollower.apply(follower.follower, _answer(1))
    for i in range(3):
        stats.record("echo", "1", Outcome(1000 + i, 5.0, ok=i != 1))

    async def turns() -> list[bool]:
        nonlocal down
        async with httpx.AsyncClient(transport=httpx.MockTransport(control)) as client:
            first = await follower.turn(client)
            down = False
            return [first, await follower.turn(client)]

    assert asyncio.run(turns()) == [False, True]
    [report] = reports
    [group] = report.outcomes
    assert (group.model, group.version, group.at_ms, group.ok) == (
        "echo", "1", [1000, 1001, 1002], [True, False, True])
    assert (report.epoch, report.generation) == ("e1", 1)  # the table it routed by meanwhile
    assert follower.follower.generation == 7 and stats.take() == []


def test_reports_shrink_until_the_control_api_takes_them() -> None:
    """A control API with a small body limit (413) still gets every outcome, in smaller
    reports."""
    stats, table = ReportingStats(), RouteTable()
    delivered: list[int] = []

    def control(request: httpx.Request) -> httpx.Response:
        if len(request.content) > 4096:
            return httpx.Response(413, json={"error": {"message": "too large"}})
        report = REPORT_DECODER.decode(request.content)
        delivered.extend(t for group in report.outcomes for t in group.at_ms)
        return httpx.Response(200, content=ENCODER.encode(_answer(1)))

    follower = ControlFollower("http://control", table, stats, gateway_id="g1")
    for i in range(1000):
        stats.record("echo", "1", Outcome(i, 1.0, ok=True))

    async def turns() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(control)) as client:
            for _ in range(60):
                await follower.turn(client)

    asyncio.run(turns())
    assert sorted(delivered) == list(range(1000))
    assert follower.batch < 1000 and table.split("echo") == {"1": 50, "2": 50}


def test_the_other_gateways_counts_fill_the_bound_and_steer_balancing() -> None:
    from podium.errors import Overloaded
    from podium.gateway.admission import Admission
    from podium.routes.stats import VersionStats

    table = RouteTable()
    follower = TableFollower(table)
    spec = SyncAnswer("e1", 1, {"echo": ModelSpec(splits={"1": 100}, endpoints={"1": [
        EndpointSpec("echo-1-a", "http://a"), EndpointSpec("echo-1-b", "http://b")]})},
        elsewhere={"echo-1-a": 4})
    follower.apply(spec)
    a, b = table.endpoint("echo-1-a"), table.endpoint("echo-1-b")
    assert (a.in_flight_elsewhere, a.load, b.load) == (4, 4, 0)
    # least in flight counts every gateway's requests: b, every time
    assert {table.resolve("echo", None)[1].id for _ in range(4)} == {"echo-1-b"}
    admission = Admission(VersionStats(), max_in_flight=4)
    try:
        admission.admit("echo", "1", a)
        raise AssertionError("a is at its bound with the other gateways' 4")
    except Overloaded as exc:
        assert "4 of them from other gateways" in exc.message
    assert admission.admit("echo", "1", b) is b
    # the same table again still refreshes the counts; an unreachable plane clears them
    follower.apply(SyncAnswer("e1", 1, spec.routes, elsewhere={"echo-1-b": 1}))
    assert (a.load, b.load) == (0, 1)
    follower.take_elsewhere({})
    assert b.load == 0
