"""Steps that skip the hop to a worker thread: SQLite reads (until they are slow) and Python
functions declared `inline`."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from podium.errors import PackageError
from podium.pipelines.steps import features
from tests.support.pipelines import build

SQL = "sqlite:///catalog.db"
MEMBER = {"name": "member", "kind": "features", "keys": "$input.member_id",
          "columns": ["genre"], "defaults": {"genre": "comedy"},
          "source": {"type": "sql", "url": SQL, "table": "members", "key_column": "member_id"}}
WHERE = '''
import threading

def where(genre):
    return {"genre": genre, "thread": threading.get_ident()}
'''


def _source(pipeline):
    return pipeline.graph.steps["member"]._source


def _genre(pipeline, member: str = "m1") -> str:
    return asyncio.run(pipeline.run({"member_id": member}, "r")).results["member"]["row"][
        "genre"]


def test_a_sqlite_file_is_read_inline_and_inline_false_keeps_the_thread(
        tmp_path: Path, catalog: Path, models) -> None:
    assert _source(build(tmp_path, models, [MEMBER])).inline
    threaded = {**MEMBER, "source": {**MEMBER["source"], "inline": False}}
    pipeline = build(tmp_path, models, [threaded])
    assert not _source(pipeline).inline
    assert _genre(pipeline) == "drama"


def test_a_bad_inline_setting_is_a_load_error_and_a_good_one_loads(
        tmp_path: Path, catalog: Path, models) -> None:
    bad = {**MEMBER, "source": {**MEMBER["source"], "inline": "yes"}}
    with pytest.raises(PackageError, match="inline='yes' must be true or false"):
        build(tmp_path, models, [bad])
    assert _genre(build(tmp_path, models, [MEMBER]), "m2") == "comedy"


def test_slow_inline_reads_move_the_source_to_worker_threads(
        tmp_path: Path, catalog: Path, models, monkeypatch) -> None:
    pipeline = build(tmp_path, models, [MEMBER])
    monkeypatch.setattr(features, "INLINE_MAX_S", 0.0)  # every read counts as slow
    for _ in range(features.INLINE_MAX_SLOW):
        assert _source(pipeline).inline
        assert _genre(pipeline) == "drama"  # a slow read still answers
    assert not _source(pipeline).inline
    assert _genre(pipeline) == "drama"  # now from a worker thread


@pytest.mark.parametrize("inline", [True, False])
def test_a_python_step_runs_on_the_loop_only_when_declared_inline(
        tmp_path: Path, catalog: Path, models, inline: bool) -> None:
    (tmp_path / "where.py").write_text(WHERE)
    steps = [MEMBER, {"name": "post", "kind": "python", "function": "where.py:where",
                      "inline": inline, "args": {"genre": "$member.row.genre"}}]
    result = asyncio.run(build(tmp_path, models, steps).run({"member_id": "m1"}, "r"))
    assert result.results["post"]["genre"] == "drama"
    on_loop = result.results["post"]["thread"] == threading.get_ident()
    assert on_loop is inline


def test_sqlite_is_read_directly_only_where_sqlalchemy_would_answer_the_same(
        tmp_path: Path, catalog: Path) -> None:
    import decimal
    import sqlite3

    from podium.pipelines.sources.sql import SqlSource

    with sqlite3.connect(catalog) as db:
        db.execute("CREATE TABLE prices (title TEXT PRIMARY KEY, price NUMERIC, f0 REAL)")
        db.execute("INSERT INTO prices VALUES ('Alpha', 1.5, 0.25)")
    options = {"url": "sqlite:///catalog.db", "table": "prices", "key_column": "title"}
    source = SqlSource(options, tmp_path)
    source.open(["price", "f0"])
    assert source._direct_for(["f0"]) is not None  # REAL: read as is
    assert source._direct_for(["price"]) is None  # NUMERIC: SQLAlchemy makes a Decimal
    assert source.fetch(["Alpha", "nope", "Alpha"], ["f0"]) == {"Alpha": {"f0": 0.25}}
    assert source.fetch(["Alpha"], ["price", "f0"]) == {
        "Alpha": {"price": decimal.Decimal("1.5"), "f0": 0.25}}
    titles = SqlSource({"url": "sqlite:///catalog.db", "table": "titles",
                        "key_column": "genre"}, tmp_path)
    titles.open(["title"])
    assert titles._direct_for(["title"]) is not None
    assert titles.candidates("drama", "title", 2) == ["Alpha", "Beta"]
