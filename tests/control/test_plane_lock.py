"""One control plane per home and per database: the second is refused, naming the first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from podium.control.plane_lock import ADVISORY_KEY, AlreadyRunning, PlaneLock, holder_info

FIRST = holder_info(host="127.0.0.1", http_port=8000, grpc_port=8001, api_port=8080)
SECOND = holder_info(host="127.0.0.1", http_port=9000, grpc_port=-1, api_port=9080)


def _sqlite(path: Path) -> str:
    return f"sqlite:///{path}"


def test_a_second_plane_on_the_same_home_is_refused_naming_the_first(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = PlaneLock.acquire(home, _sqlite(home / "control.db"), FIRST)
    try:
        with pytest.raises(AlreadyRunning) as refused:
            PlaneLock.acquire(home, _sqlite(home / "control.db"), SECOND)
        message = refused.value.message
        assert f"pid {os.getpid()}" in message
        assert "gateway :8000, gRPC :8001, API :8080" in message
        assert f"lock {home / 'up.lock'}" in message and "\n" not in message
        assert not (home / "control.db").exists()  # nothing but the lock files was written
    finally:
        first.release()
    again = PlaneLock.acquire(home, _sqlite(home / "control.db"), SECOND)  # freed: a restart
    again.release()


def test_two_homes_sharing_one_sqlite_database_are_refused(tmp_path: Path) -> None:
    shared = _sqlite(tmp_path / "shared.db")
    first = PlaneLock.acquire(tmp_path / "a", shared, FIRST)
    try:
        with pytest.raises(AlreadyRunning,
                           match=r"database .*shared\.db \(lock .*shared\.db\.lock"):
            PlaneLock.acquire(tmp_path / "b", shared, SECOND)
        # the refused one let go of what it had taken (its own home's lock)
        PlaneLock.acquire(tmp_path / "b", _sqlite(tmp_path / "b.db"), SECOND).release()
    finally:
        first.release()


def test_the_lock_dies_with_its_process_even_by_kill_9(tmp_path: Path) -> None:
    """A crashed control plane never blocks its restart: the kernel drops the flock."""
    home = tmp_path / "home"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path\n"
        "from podium.control.plane_lock import PlaneLock, holder_info\n"
        f"PlaneLock.acquire(Path({str(home)!r}), 'sqlite:///{home}/c.db', holder_info("
        "host='h', http_port=1, grpc_port=2, api_port=3))\n"
        "print('locked', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(AlreadyRunning, match=f"pid {holder.pid} on"):
            PlaneLock.acquire(home, _sqlite(home / "c.db"), SECOND)
    finally:
        holder.kill()
        holder.wait()
    PlaneLock.acquire(home, _sqlite(home / "c.db"), SECOND).release()


@pytest.mark.postgres
def test_two_homes_sharing_one_postgres_database_are_refused(
        tmp_path: Path, fresh_postgres: str) -> None:
    first = PlaneLock.acquire(tmp_path / "a", fresh_postgres, FIRST)
    try:
        with pytest.raises(AlreadyRunning) as refused:
            PlaneLock.acquire(tmp_path / "b", fresh_postgres, SECOND)
        assert f"another podium up (pid {os.getpid()} on " in refused.value.message
        assert "advisory lock" in refused.value.message
    finally:
        first.release()
    PlaneLock.acquire(tmp_path / "b", fresh_postgres, SECOND).release()


def _kill_lock_backend(url: str) -> None:
    """What a database restart does to the plane's lock connection."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as c:
        killed = c.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND objid = :key"), {"key": ADVISORY_KEY}).all()
        c.commit()
    engine.dispose()
    assert killed == [(True,)]


@pytest.mark.postgres
def test_a_lock_lost_with_its_connection_is_taken_again_or_the_plane_is_deposed(
        tmp_path: Path, fresh_postgres: str) -> None:
    first = PlaneLock.acquire(tmp_path / "a", fresh_postgres, FIRST)
    try:
        assert first.renew()
        _kill_lock_backend(fresh_postgres)
        assert first.renew()  # nobody took it meanwhile: this plane holds it again
        with pytest.raises(AlreadyRunning):  # and really holds it
            PlaneLock.acquire(tmp_path / "b", fresh_postgres, SECOND)

        _kill_lock_backend(fresh_postgres)
        second = PlaneLock.acquire(tmp_path / "b", fresh_postgres, SECOND)  # took it
        try:
            with pytest.raises(AlreadyRunning, match="advisory lock"):
                first.renew()
        finally:
            second.release()
    finally:
        first.release()


def test_renew_without_a_database_lock_is_a_no_op(tmp_path: Path) -> None:
    lock = PlaneLock.acquire(tmp_path / "h", _sqlite(tmp_path / "h" / "c.db"), FIRST)
    try:
        assert lock.renew()
    finally:
        lock.release()
