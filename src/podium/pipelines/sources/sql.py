"""The `sql` feature source: one table read through SQLAlchemy (SQLite file or PostgreSQL).

Settings: `url` (a relative `sqlite:///file.db` is inside the package), `table`, `key_column`,
`batch_size`, `inline`. Keys are read in batches of `batch_size` with one `WHERE key IN (...)`
each; the engine (and its pool) is shared by every step naming the same URL. A SQLite file is
read on the event loop by default (`inline`, a local read of a few hundred microseconds costs
less than the hop to a worker thread) until one read is slow; `"inline": false` keeps every read
in a worker thread; a server database (PostgreSQL) is always read in a worker thread. A SQLite
file is read through `sqlite3` directly (`sources.sqlite_direct`) where that answers exactly
what SQLAlchemy would.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from podium.errors import PackageError
from podium.pipelines.sources import FeatureSource

_ENGINES: dict[str, Any] = {}
_TABLES: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


class SqlSource(FeatureSource):
    """Rows of one table by its key column."""

    def __init__(self, options: dict[str, Any], root: Path) -> None:
        unknown = set(options) - {"url", "table", "key_column", "batch_size", "inline"}
        if unknown:
            raise PackageError(f"sql source: unknown field(s) {sorted(unknown)}; fields: url, "
                               "table, key_column, batch_size, inline")
        for name in ("url", "table", "key_column"):
            if not isinstance(options.get(name), str) or not options[name]:
                raise PackageError(f"sql source: field `{name}` is required (a string)")
        self.url = resolve_url(options["url"], root)
        self.table_name = options["table"]
        self.key_column = options["key_column"]
        self.batch_size = int(options.get("batch_size", 500))
        self._queries: dict[tuple[Any, ...], Any] = {}
        self._direct: Any = None  # a SqliteReader for a SQLite file (set by open)
        self._plain: set[str] = set()
        if not 1 <= self.batch_size <= 10_000:
            raise PackageError(f"sql source: batch_size={self.batch_size} must be 1..10000")
        inline = options.get("inline", True)
        if not isinstance(inline, bool):
            raise PackageError(f"sql source: inline={inline!r} must be true or false")
        # only a file of this machine is known-fast; ":memory:" and servers are not inlined
        self.inline = inline and _sqlite_file(self.url)

    def open(self, columns: list[str]) -> None:
        table = self._table()
        for name in columns:
            self._column(table, name)
        if _sqlite_file(self.url):
            from podium.pipelines.sources.sqlite_direct import SqliteReader, plain_column

            self._direct = SqliteReader(self.url[len("sqlite:///"):], self.table_name,
                                        self.key_column)
            if plain_column(table.c[self.key_column], bound=True):
                self._plain = {c.name for c in table.c if plain_column(c)}

    def _direct_for(self, columns: list[str]) -> Any:
        """The `sqlite3` reader when it reads these columns as SQLAlchemy would, else None."""
        if self._direct is None or self.key_column not in self._plain:
            return None
        return self._direct if all(c in self._plain for c in columns) else None

    def fetch(self, keys: list[Any], columns: list[str]) -> dict[Any, dict[str, Any]]:
        rows: dict[Any, dict[str, Any]] = {}
        unique = list(dict.fromkeys(keys))
        direct = self._direct_for(columns)
        if direct is not None:
            for start in range(0, len(unique), self.batch_size):
                for row in direct.fetch(unique[start:start + self.batch_size], columns):
                    rows[row[0]] = dict(zip(columns, row[1:], strict=True))
            return rows
        query = self._query(("fetch", *columns))
        with self._engine().connect() as connection:
            for start in range(0, len(unique), self.batch_size):
                chunk = unique[start:start + self.batch_size]
                for row in connection.execute(query, {"keys": chunk}):
                    rows[row[0]] = dict(zip(columns, row[1:], strict=True))
        return rows

    def candidates(self, key: Any, column: str, limit: int) -> list[Any]:
        direct = self._direct_for([column])
        if direct is not None:
            return direct.candidates(key, column, limit)
        query = self._query(("candidates", column, limit))
        with self._engine().connect() as connection:
            return [row[0] for row in connection.execute(query, {"key": key})]

    def _query(self, shape: tuple[Any, ...]) -> Any:
        """The statement of this shape, built once: a request only binds its keys (building
        and compiling a select per read cost more than the read itself)."""
        query = self._queries.get(shape)
        if query is None:
            import sqlalchemy as sa

            table = self._table()
            if shape[0] == "fetch":
                wanted = [table.c[self.key_column],
                          *(self._column(table, name) for name in shape[1:])]
                query = sa.select(*wanted).where(table.c[self.key_column].in_(
                    sa.bindparam("keys", expanding=True)))
            else:
                _, column, limit = shape
                query = (sa.select(self._column(table, column))
                         .where(table.c[self.key_column] == sa.bindparam("key")).limit(limit))
            self._queries[shape] = query
        return query

    def _column(self, table: Any, name: str) -> Any:
        if name not in table.c:
            raise PackageError(f"sql source: table {self.table_name!r} has no column {name!r} "
                               f"(columns: {', '.join(table.c.keys())})")
        return table.c[name]

    def _table(self) -> Any:
        import sqlalchemy as sa

        key = (self.url, self.table_name)
        if key not in _TABLES:
            engine = self._engine()
            try:
                table = sa.Table(self.table_name, sa.MetaData(), autoload_with=engine)
            except sa.exc.NoSuchTableError:
                raise PackageError(f"sql source: no table {self.table_name!r} at "
                                   f"{engine.url.render_as_string()}") from None
            if self.key_column not in table.c:
                raise PackageError(f"sql source: table {self.table_name!r} has no key column "
                                   f"{self.key_column!r}")
            _TABLES[key] = table
        return _TABLES[key]

    def _engine(self) -> Any:
        import sqlalchemy as sa

        with _LOCK:
            if self.url not in _ENGINES:
                # a file has no connection to go stale: a ping per read is pure cost there
                _ENGINES[self.url] = sa.create_engine(
                    self.url, pool_pre_ping=not self.url.startswith("sqlite"))
            return _ENGINES[self.url]


def _sqlite_file(url: str) -> bool:
    return url.startswith("sqlite:///") and url != "sqlite:///" and ":memory:" not in url


def resolve_url(url: str, root: Path) -> str:
    """A relative `sqlite:///file` URL made absolute inside the package (never outside)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and url != prefix:
        relative = url[len(prefix):]
        path = (root / relative).resolve()
        if not path.is_relative_to(root.resolve()):
            raise PackageError(f"sql source: url={url!r} leaves the package; name a file "
                               "inside it or give an absolute URL")
        return prefix + str(path)
    return url
