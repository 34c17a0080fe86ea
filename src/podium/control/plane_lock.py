"""One control plane per home and per database: `podium up` holds these locks for its life.

- an exclusive `flock` on `$PODIUM_HOME/up.lock`, whose text names the holder (pid, host,
  ports) so a refused second `podium up` can say which one runs;
- for a SQLite database, the same on `<database file>.lock`, so two homes given one file by
  `--database` are refused too;
- for PostgreSQL, a session advisory lock (`pg_try_advisory_lock`) on a connection kept open;
  advisory locks live per database, and the holder's `application_name` names it.

The kernel and the database server drop these locks when their process dies, even by kill -9,
so a crashed control plane never blocks its own restart. Taking them writes nothing anywhere
but the lock files.

The database server also drops the advisory lock when the lock's connection goes (a database
restart, a killed backend): `renew()` takes it again on a new connection, or raises
AlreadyRunning when another plane took it meanwhile, so the plane stops acting instead of two
planes driving one database.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from podium.errors import Conflict

# pg_try_advisory_lock(bigint) key: below 2**31 so pg_locks shows it whole in `objid`
ADVISORY_KEY = 0x50_6F_64_75  # "Podu"
_HOLDER_QUERY = text("""
    SELECT a.application_name, a.client_addr, a.pid FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = :key
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
""")


_HELD_QUERY = text("""
    SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = 0
      AND objid = :key AND pid = pg_backend_pid()
""")


class AlreadyRunning(Conflict):
    """Another `podium up` holds this home or database (exit 2 at the CLI)."""


class PlaneLock:
    """The locks of one running control plane; `release()` (or process exit) frees them."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._connection: Connection | None = None
        self._postgres: tuple[str, str] | None = None  # (url, application name) to renew with

    @classmethod
    def acquire(cls, home: Path, database_url: str, holder: dict[str, Any]) -> PlaneLock:
        """Take every lock or none; AlreadyRunning names the holder of the first one taken."""
        lock = cls()
        described = describe(holder)
        try:
            home.mkdir(parents=True, exist_ok=True)
            lock._lock_file(home / "up.lock", holder, "this home")
            url = make_url(database_url)
            if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
                db = Path(url.database).resolve()  # type: ignore[arg-type]
                lock._lock_file(db.with_name(db.name + ".lock"), holder, f"database {db}")
            elif url.get_backend_name() == "postgresql":
                lock._postgres = (database_url, f"podium up {described}")
                lock._lock_postgres(*lock._postgres)
        except BaseException:
            lock.release()
            raise
        return lock

    def release(self) -> None:
        """Free every lock held (idempotent)."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()
            with contextlib.suppress(Exception):
                self._connection.engine.dispose()
            self._connection = None

    def renew(self) -> bool:
        """Make sure the database lock is still this plane's: True when it is (or there is
        none), False when the database cannot be asked now (try again later); raises
        AlreadyRunning when another plane took it while this one's connection was gone."""
        if self._postgres is None:
            return True
        if self._connection is not None:
            try:
                held = self._connection.execute(_HELD_QUERY, {"key": ADVISORY_KEY}).scalar()
                self._connection.commit()
                if held:
                    return True
            except Exception:  # the connection died with the server or its backend
                pass
            with contextlib.suppress(Exception):
                self._connection.close()
            with contextlib.suppress(Exception):
                self._connection.engine.dispose()
            self._connection = None
        try:
            self._lock_postgres(*self._postgres)
        except AlreadyRunning:
            raise
        except Exception:
            return False  # still away: the loop's own outage handling says so
        return True

    def _lock_file(self, path: Path, holder: dict[str, Any], what: str) -> None:
        # os.open is close-on-exec: instances started later never inherit (and keep) the lock
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            running = _read_holder(fd)
            os.close(fd)
            raise AlreadyRunning(
                f"another podium up ({describe(running) if running else 'pid unknown'}) "
                f"already runs the control plane of {what} (lock {path}); stop it first, or "
                "give this one its own PODIUM_HOME and --database", param="home") from None
        self._fds.append(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)

    def _lock_postgres(self, url: str, name: str) -> None:
        engine = create_engine(url, poolclass=NullPool,
                               connect_args={"application_name": name[:63]})
        connection = engine.connect()
        got = connection.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                 {"key": ADVISORY_KEY}).scalar()
        if got:
            connection.commit()  # the lock is the session's: no transaction stays open
            self._connection = connection
            return
        row = connection.execute(_HOLDER_QUERY, {"key": ADVISORY_KEY}).first()
        connection.close()
        engine.dispose()
        name = (row[0] or "").removeprefix("podium up ") if row else ""
        who = (f"{name or 'a client'} from {row[1] or 'a local socket'}, server pid {row[2]}"
               if row else "holder unknown")
        raise AlreadyRunning(
            f"another podium up ({who}) already runs the control plane of database "
            f"{make_url(url).database} (advisory lock {ADVISORY_KEY}); stop it first, or give "
            "this one its own --database", param="database")


def holder_info(*, host: str, http_port: int, grpc_port: int, api_port: int) -> dict[str, Any]:
    """What a lock file says about the process holding it."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "bind": host,
            "http_port": http_port, "grpc_port": grpc_port, "api_port": api_port}


def describe(holder: dict[str, Any]) -> str:
    """`pid 123 on host, gateway :8000, gRPC :8001, API :8080`."""
    grpc = holder.get("grpc_port")
    return (f"pid {holder.get('pid')} on {holder.get('host')}, gateway "
            f":{holder.get('http_port')}, gRPC {'off' if grpc == -1 else f':{grpc}'}, "
            f"API :{holder.get('api_port')}")


def _read_holder(fd: int) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return data if isinstance(data, dict) else None
    return None
