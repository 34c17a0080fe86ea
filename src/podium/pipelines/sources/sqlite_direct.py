"""Reads of a SQLite file through `sqlite3` itself, for the `sql` source.

The statements are the ones the source's SQLAlchemy selects compile to (the same quoting,
one `?` per key), written once per shape; each thread has its own connection to the file.
SQLAlchemy's execution path (the pool checkout, the compiled-cache lookup, the result
objects) cost about twice the read itself: a third of the event loop's time per `recommend`
request at c=32 (py-spy). Used only where it answers exactly what SQLAlchemy would: every
column read has no type processing in SQLAlchemy's SQLite dialect (TEXT, INTEGER, REAL, BLOB;
not NUMERIC, DATE or BOOLEAN, which SQLAlchemy converts), nor has the key column when bound
(TEXT, INTEGER; not REAL, whose keys SQLAlchemy makes floats).
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any


def plain_column(column: Any, *, bound: bool = False) -> bool:
    """Whether SQLAlchemy reads this column (a SQLAlchemy column) unchanged on SQLite, and
    with `bound` also binds values compared with it unchanged (the key column)."""
    from sqlalchemy.dialects import sqlite

    dialect = sqlite.dialect()
    impl = column.type.dialect_impl(dialect)
    return (impl.result_processor(dialect, None) is None
            and not (bound and impl.bind_processor(dialect) is not None))


class SqliteReader:
    """`fetch` and `candidates` of one table of one SQLite file."""

    def __init__(self, path: str, table: str, key_column: str) -> None:
        from sqlalchemy.dialects import sqlite

        quote = sqlite.dialect().identifier_preparer.quote
        self.path = path
        self.table = quote(table)
        self.key = quote(key_column)
        self._quote = quote
        self._local = threading.local()
        self._sql: dict[tuple[Any, ...], str] = {}

    def fetch(self, keys: list[Any], columns: list[str]) -> list[tuple[Any, ...]]:
        """Rows (key, *columns) of the keys the table has."""
        sql = self._sql.get(("fetch", len(keys), *columns))
        if sql is None:
            wanted = ", ".join([self.key, *map(self._quote, columns)])
            sql = (f"SELECT {wanted} FROM {self.table} WHERE {self.key} IN "
                   f"({', '.join('?' * len(keys))})")
            self._sql[("fetch", len(keys), *columns)] = sql
        return self._connection().execute(sql, keys).fetchall()

    def candidates(self, key: Any, column: str, limit: int) -> list[Any]:
        sql = self._sql.get(("candidates", column, limit))
        if sql is None:
            sql = (f"SELECT {self._quote(column)} FROM {self.table} WHERE {self.key} = ? "
                   f"LIMIT {int(limit)}")
            self._sql[("candidates", column, limit)] = sql
        return [row[0] for row in self._connection().execute(sql, (key,))]

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            # autocommit: a read holds no transaction (and no lock) past its statement
            connection = sqlite3.connect(self.path, isolation_level=None,
                                         check_same_thread=True)
            self._local.connection = connection
        return connection
