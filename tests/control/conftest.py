"""Control-plane fixtures: every store test runs against a SQLite file and a real PostgreSQL
server; the API tests share one control plane over a fake world (`env`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from podium.control.store import Store
from tests.support.control_api import Env
from tests.support.postgres_url import postgres_url as shared_postgres_url
from tests.support.up_process import Up


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the test PostgreSQL server (started on demand)."""
    return shared_postgres_url()


@pytest.fixture
def fresh_postgres(postgres_url: str) -> Iterator[str]:
    """A brand-new, empty database on the test server, dropped afterwards."""
    name = f"podium_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database URL: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'control.db'}"
    return request.getfixturevalue("fresh_postgres")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A migrated store on each backend."""
    opened = Store.open(store_url)
    yield opened
    opened.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    """A control plane on a fresh SQLite store, its API client and a fake world."""
    e = Env(tmp_path)
    yield e
    e.store.close()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """A real `podium up` process on free loopback ports; terminated after the test."""
    u = Up(tmp_path)
    yield u
    if u.process is not None and u.process.poll() is None:
        u.process.terminate()
        u.process.wait(timeout=60)
    u.kill_gateways()  # a test that killed its plane for good leaves no gateway behind
