"""The local runtime's test world: a SQLite store, a route table, and tiny processes
(`fake_serve.py`) standing in for `podium serve`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from podium.control.runtime.local import LocalRuntime
from podium.control.store import Store
from podium.routes.table import RouteTable

FAKE = Path(__file__).parent / "fake_serve.py"


def fake_command(package: str, http_port: int, _grpc_port: int) -> list[str]:
    return [sys.executable, str(FAKE), package, str(http_port)]


def wait_for(condition: Callable[[], bool], runtime: LocalRuntime, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        runtime.poll()
        time.sleep(0.05)


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
        self.table = RouteTable()
        self.runtimes: list[LocalRuntime] = []

    def package(self, version: str, manifest: dict | None = None, backend: str = "python",
                **behaviour: object) -> None:
        folder = self.tmp / f"iris-{version}"
        folder.mkdir()
        (folder / "behaviour.json").write_text(json.dumps(behaviour))
        self.store.announce_package("iris", version, backend, str(folder), manifest or {})
        self.store.ensure_deployment("iris", version, "red-black")

    def runtime(self, **kwargs: object) -> LocalRuntime:
        runtime = LocalRuntime(self.store, self.table, self.tmp / "work",
                               command=fake_command, **kwargs)  # type: ignore[arg-type]
        self.runtimes.append(runtime)
        return runtime


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    for runtime in e.runtimes:
        runtime.close()
    e.store.close()
