"""The store on SQLite and PostgreSQL: migrations, packages, rollouts, desired state."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from podium.control.actions import MoveAlias, Scale, SetSplit
from podium.control.models import Base, RolloutStepRow
from podium.control.rollout import Decision, begin
from podium.control.rollout_config import RolloutConfig
from podium.control.store import Store
from podium.errors import Conflict, InvalidArgument, NotFound


def _announce(store: Store, name: str = "iris", version: str = "1") -> None:
    store.announce_package(name, version, "python", f"/pkgs/{name}-{version}",
                           {"name": name, "version": version, "backend": "python"})


def test_migrations_create_the_schema_the_models_describe(store: Store) -> None:
    tables = set(inspect(store.engine).get_table_names())
    assert {"packages", "deployments", "instances", "rollouts", "rollout_steps",
            "traffic_splits", "aliases", "events", "alembic_version"} <= tables
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_open_twice_is_idempotent(store_url: str) -> None:
    first = Store.open(store_url)
    _announce(first)
    first.close()
    second = Store.open(store_url)
    assert [p.version for p in second.list_packages()] == ["1"]
    second.close()


def test_announce_then_duplicate_is_a_conflict_and_changes_nothing(store: Store) -> None:
    _announce(store)
    with pytest.raises(Conflict, match="iris@1 is already announced"):
        _announce(store)
    _announce(store, version="2")
    assert [(p.name, p.version) for p in store.list_packages()] == [("iris", "1"), ("iris", "2")]
    assert store.get_package("iris", "2").location == "/pkgs/iris-2"


def test_unknown_package_names_the_known_versions(store: Store) -> None:
    _announce(store)
    with pytest.raises(NotFound, match="iris@9 is not announced; announced versions: 1"):
        store.get_package("iris", "9")


def test_second_running_rollout_of_a_model_is_a_conflict(store: Store) -> None:
    config = RolloutConfig()
    first = store.create_rollout(begin("iris", "2", "1", config, num_old=2))
    with pytest.raises(Conflict, match=f"rollout {first} of iris is still running"):
        store.create_rollout(begin("iris", "3", "1", config, num_old=2))
    # another model is independent
    store.create_rollout(begin("digits", "1", None, config))
    assert [r.state.to_version for r in store.list_rollouts("iris")] == ["2"]


def test_partial_unique_index_rejects_two_running_rollouts(store: Store) -> None:
    # bypass the application check: the database itself must refuse a second running rollout
    from sqlalchemy.exc import IntegrityError

    from podium.control.models import RolloutRow

    state = begin("iris", "2", "1", RolloutConfig(), num_old=1)
    with pytest.raises(IntegrityError):  # noqa: SIM117 - the inner block is the transaction
        with store.session() as s:
            for _ in range(2):
                s.add(RolloutRow(model="iris", to_version="2", strategy="red-black",
                                 status="running", reason="", state=state.to_dict(),
                                 num_steps=0))
                s.flush()


def test_a_step_is_written_with_the_desired_state_it_implies(store: Store) -> None:
    state = begin("iris", "2", "1", RolloutConfig(), num_old=2)
    rollout_id = store.create_rollout(state)
    actions = [Scale("iris", "2", 1), SetSplit("iris", {"1": 90, "2": 10}),
               MoveAlias("iris", "latest", "2")]
    store.record_step(rollout_id, Decision(state, actions, "stage 1"), at_ms=1234)

    assert store.get_deployment("iris", "2").num_desired == 1
    assert store.splits("iris") == {"1": 90, "2": 10}
    assert store.aliases("iris") == {"latest": "2"}
    [step] = store.rollout_steps(rollout_id)
    assert (step.seq, step.at_ms, step.note) == (1, 1234, "stage 1")
    assert step.actions[1] == {"model": "iris", "weights": {"1": 90, "2": 10}, "kind": "split"}
    record = store.get_rollout(rollout_id)
    assert record.num_steps == 1
    assert record.state.legs == (state,)  # a one-region rollout: one leg


def test_a_failing_step_writes_nothing(store: Store) -> None:
    with pytest.raises(NotFound):
        store.record_step(999, Decision(begin("iris", "2", None, RolloutConfig()),
                                        [Scale("iris", "2", 3)], "x"), at_ms=1)
    assert store.count(RolloutStepRow) == 0
    assert store.list_deployments() == []


@pytest.mark.parametrize(("low", "high", "field"), [
    (-1, 2, "min_instances"), (1, 65, "max_instances"), (3, 2, "min_instances"),
], ids=["negative-min", "max-too-large", "min-above-max"])
def test_scaling_out_of_range_is_rejected_and_changes_nothing(
        store: Store, low: int, high: int, field: str) -> None:
    store.ensure_deployment("iris", "1", "red-black", min_instances=1, max_instances=2)
    with pytest.raises(InvalidArgument) as info:
        store.set_scaling("iris", "1", low, high)
    assert info.value.param == field
    row = store.get_deployment("iris", "1")
    assert (row.min_instances, row.max_instances) == (1, 2)
    store.set_scaling("iris", "1", 2, 4)
    row = store.get_deployment("iris", "1")
    assert (row.min_instances, row.max_instances, row.num_desired) == (2, 4, 2)


def test_instances_are_tracked_per_deployment(store: Store) -> None:
    store.ensure_deployment("iris", "1", "red-black")
    first = store.add_instance("iris", "1", http_port=9001)
    store.add_instance("iris", "1", http_port=9002)
    store.update_instance(first, state="stopped")
    live = store.list_instances("iris")
    assert [(m, v, i.http_port, i.state) for m, v, i in live] == [("iris", "1", 9002, "starting")]
    assert len(store.list_instances(include_stopped=True)) == 2
    with pytest.raises(NotFound):
        store.add_instance("iris", "7")
