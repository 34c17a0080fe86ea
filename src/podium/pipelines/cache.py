"""The result cache: answers precomputed by `podium batch`, read first by the live path.

One row per (pipeline, version, key): the outputs as JSON, the variant, when it was written.
An answer is fresh for the pipeline's `ttl_s` and only for the version that wrote it, so a new
version recomputes live until its own batch has run. Writes replace rows in one transaction
per batch (delete then insert: the same statements on SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.package.manifest import ResultCacheSettings
from podium.pipelines.sources.sql import resolve_url

_ENGINES: dict[str, Any] = {}
_LOCK = threading.Lock()


@dataclass
class CachedAnswer:
    outputs: dict[str, Any]
    variant: str
    written_at: float


class ResultCache:
    """Answers of one pipeline version by key."""

    def __init__(self, settings: ResultCacheSettings, root: Path, pipeline: str,
                 version: str) -> None:
        self.settings = settings
        self.url = resolve_url(settings.url, root)
        self.pipeline, self.version = pipeline, version
        self._table: Any = None
        self._get: Any = None

    def get(self, key: str, now: float | None = None) -> CachedAnswer | None:
        """The fresh answer for `key` written by this version, if any."""
        if self._get is None:  # built once: a hit binds only its key
            import sqlalchemy as sa

            table = self.table()
            self._get = sa.select(table.c.outputs, table.c.variant, table.c.written_at).where(
                table.c.pipeline == self.pipeline, table.c.version == self.version,
                table.c.key == sa.bindparam("key"))
        with self._engine().connect() as connection:
            row = connection.execute(self._get, {"key": str(key)}).first()
        if row is None or row.written_at + self.settings.ttl_s <= (now or time.time()):
            return None
        return CachedAnswer(json.loads(row.outputs), row.variant, row.written_at)

    def fresh_keys(self, now: float | None = None) -> set[str]:
        """Keys this version has a fresh answer for (what a resumed batch skips)."""
        import sqlalchemy as sa

        table = self.table()
        oldest = (now or time.time()) - self.settings.ttl_s
        query = sa.select(table.c.key).where(
            table.c.pipeline == self.pipeline, table.c.version == self.version,
            table.c.written_at > oldest)
        with self._engine().connect() as connection:
            return {row[0] for row in connection.execute(query)}

    def put_many(self, answers: list[tuple[str, dict[str, Any], str]],
                 now: float | None = None) -> None:
        """Write (key, outputs, variant) answers, replacing older ones, in one transaction."""
        import sqlalchemy as sa

        if not answers:
            return
        table, written = self.table(), now or time.time()
        keys = [str(key) for key, _, _ in answers]
        with self._engine().begin() as connection:
            connection.execute(sa.delete(table).where(
                table.c.pipeline == self.pipeline, table.c.version == self.version,
                table.c.key.in_(keys)))
            connection.execute(sa.insert(table), [
                {"pipeline": self.pipeline, "version": self.version, "key": str(key),
                 "outputs": json.dumps(outputs), "variant": variant, "written_at": written}
                for key, outputs, variant in answers])

    def table(self) -> Any:
        import sqlalchemy as sa

        if self._table is None:
            metadata = sa.MetaData()
            table = sa.Table(
                self.settings.table, metadata,
                sa.Column("pipeline", sa.String(63), primary_key=True),
                sa.Column("version", sa.String(63), primary_key=True),
                sa.Column("key", sa.String(255), primary_key=True),
                sa.Column("outputs", sa.Text, nullable=False),
                sa.Column("variant", sa.String(255), nullable=False),
                sa.Column("written_at", sa.Float, nullable=False))
            metadata.create_all(self._engine(), checkfirst=True)
            self._table = table
        return self._table

    def _engine(self) -> Any:
        import sqlalchemy as sa

        with _LOCK:
            if self.url not in _ENGINES:
                # a file has no connection to go stale: no ping per read there
                _ENGINES[self.url] = sa.create_engine(
                    self.url, pool_pre_ping=not self.url.startswith("sqlite"))
            return _ENGINES[self.url]
