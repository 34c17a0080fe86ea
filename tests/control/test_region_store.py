"""Regions in the store, on SQLite and PostgreSQL: the migration keeps a single-region plane's
rows (in region `default`), and deployments, splits, aliases and instances are per region."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import text

from podium.control.actions import MoveAlias, Scale, SetSplit
from podium.control.database import MIGRATIONS, connect
from podium.control.region_config import RegionSpec
from podium.control.store import Store
from podium.errors import NotFound


def test_migrating_a_single_region_database_keeps_its_rows_in_region_default(
        store_url: str) -> None:
    engine = connect(store_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:  # the database as the release before regions left it
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
        conn.execute(text(
            "INSERT INTO deployments (model, version, strategy, state, num_desired, "
            "min_instances, max_instances, last_request_ms, created_at) VALUES "
            "('iris', '1', 'red-black', 'active', 2, 1, 2, 0, CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO traffic_splits VALUES ('iris', '1', 100)"))
        conn.execute(text("INSERT INTO aliases VALUES ('iris', 'latest', '1')"))
    engine.dispose()

    store = Store.open(store_url)
    try:
        assert store.splits("iris") == {"1": 100}
        assert store.aliases("iris") == {"latest": "1"}
        assert store.get_deployment("iris", "1").region == "default"
        assert store.region_names() == ["default"]
        assert store.desired_actions() == [Scale("iris", "1", 2), SetSplit("iris", {"1": 100}),
                                           MoveAlias("iris", "latest", "1")]
    finally:
        store.close()


def test_each_region_has_its_own_deployments_splits_aliases_and_instances(store: Store) -> None:
    store.set_regions([RegionSpec("eu", http_port=9000, grpc_port=9001),
                       RegionSpec("us", http_port=9002, grpc_port=-1)])
    assert store.region_names() == ["eu", "us"]
    assert [(r.name, r.grpc_port) for r in store.list_regions()] == [("eu", 9001), ("us", -1)]
    store.announce_package("iris", "1", "python", "/p/1", {})
    store.announce_package("iris", "2", "python", "/p/2", {})
    store.apply([Scale("iris", "1", 2, region="eu"), SetSplit("iris", {"1": 100}, region="eu"),
                 MoveAlias("iris", "latest", "1", region="eu"),
                 Scale("iris", "2", 1, region="us"), SetSplit("iris", {"2": 100}, region="us"),
                 MoveAlias("iris", "latest", "2", region="us")])

    assert store.splits("iris", "eu") == {"1": 100} and store.splits("iris", "us") == {"2": 100}
    assert store.aliases("iris", "us") == {"latest": "2"}
    assert store.splits("iris") == {}  # nothing in `default`
    assert [d.version for d in store.list_deployments("iris", region="eu")] == ["1"]
    with pytest.raises(NotFound, match="no deployment of iris@1 in region us"):
        store.get_deployment("iris", "1", region="us")

    eu, us = store.for_region("eu"), store.for_region("us")
    eu.add_instance("iris", "1", pid=11)
    us.add_instance("iris", "2", pid=22)
    with pytest.raises(NotFound, match="in region us"):
        us.add_instance("iris", "1")
    # a region's runtime sees (and adopts) its own instances only
    assert [(v, i.pid) for _, v, i in eu.list_instances()] == [("1", 11)]
    assert [(v, i.pid) for _, v, i in us.list_instances()] == [("2", 22)]
    assert len(store.list_instances()) == 2
    actions = store.desired_actions()
    assert Scale("iris", "2", 1, region="us") in actions
    assert SetSplit("iris", {"1": 100}, region="eu") in actions

    store.set_regions([RegionSpec("us", http_port=9002, grpc_port=9003)])  # redeclared
    assert store.region_names() == ["us"]
    store.set_regions([])
    assert store.region_names() == ["default"]
