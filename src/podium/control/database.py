"""Connecting to the control-plane database: engine options per dialect, the schema migrations,
and "unreachable" as one error (`StoreUnavailable`) whatever the driver says.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import InterfaceError, OperationalError

from podium.errors import Unavailable

MIGRATIONS = Path(__file__).with_name("migrations")
CONNECT_TIMEOUT_S = 5
"""A PostgreSQL server that does not answer is given up on after this (a refused one at once)."""


class StoreUnavailable(Unavailable):
    """The control-plane database cannot be reached right now; nothing was written."""


def connect(url: str) -> Engine:
    """An engine for `url`; SQLite files get their pragmas, PostgreSQL a connect timeout."""
    args: dict[str, Any] = {}
    if url.startswith("postgresql"):
        args["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    # pre-ping: after a database restart every pooled connection is dead; they are replaced
    # at checkout instead of failing the first call on each
    engine = create_engine(url, future=True, pool_pre_ping=True, **args)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def migrate(engine: Engine) -> None:
    """Apply every pending Alembic migration, configured in code (no alembic.ini)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@contextmanager
def unreachable_is_unavailable() -> Iterator[None]:
    """Turn the driver's connection failures (refused, reset, server shutting down) into
    StoreUnavailable naming the driver's own reason."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable(f"the control-plane database is unreachable "
                               f"({_first_line(exc)})") from exc


def _first_line(exc: Exception) -> str:
    """The driver's message, first line, without SQLAlchemy's statement dump."""
    inner = getattr(exc, "orig", None) or exc
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0][:300] if lines else 'no message'}"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    # WAL + NORMAL survives a killed process (only power loss can drop the last commits)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()
