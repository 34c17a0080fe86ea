"""The SQL feature source and the result cache on PostgreSQL (SQLite is the other tests')."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.pipelines import build
from tests.support.postgres_url import postgres_url

pytestmark = pytest.mark.postgres


@pytest.fixture
def titles() -> Iterator[tuple[str, str]]:
    url, table = postgres_url(), f"titles_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(url)
    with engine.begin() as db:
        db.execute(sa.text(f"CREATE TABLE {table} (title TEXT PRIMARY KEY, f0 REAL, f1 REAL)"))
        db.execute(sa.text(f"INSERT INTO {table} VALUES ('A', 0.5, 0.25), ('B', 1, 2)"))
    try:
        yield url, table
    finally:
        with engine.begin() as db:
            db.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
            db.execute(sa.text(f"DROP TABLE IF EXISTS cache_{table}"))
        engine.dispose()


def test_features_in_batches_and_the_result_cache_on_postgresql(tmp_path: Path, models,
                                                                 titles) -> None:
    url, table = titles
    pipeline = build(tmp_path, models, [{
        "name": "feats", "kind": "features", "keys": ["A", "B", "Z"], "columns": ["f0", "f1"],
        "defaults": {"f0": 0, "f1": 0},
        "source": {"type": "sql", "url": url, "table": table, "key_column": "title",
                   "batch_size": 1}}],
        result_cache={"url": url, "table": f"cache_{table}", "key": "member_id"})
    found = asyncio.run(pipeline.run({"member_id": "m1"}, "r")).results["feats"]
    assert found["matrix"] == [[0.5, 0.25], [1, 2], [0, 0]] and found["missing"] == ["Z"]
    cache = pipeline.cache
    cache.put_many([("m1", {"titles": ["A"]}, "control")])
    cache.put_many([("m1", {"titles": ["B"]}, "control")])  # replaces, in one transaction
    assert cache.get("m1").outputs == {"titles": ["B"]}
    assert cache.fresh_keys() == {"m1"}
    assert cache.get("m1", now=cache.get("m1").written_at + 86_400) is None  # past the TTL
