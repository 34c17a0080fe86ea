"""Fixtures shared by the gateway's test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.echo_platform import write_echo
from tests.support.grpc_servers import Instance


@pytest.fixture(scope="session")
def echo_instances(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Instance]]:
    """Two `podium serve` processes of the echo model, v1 (x*10) and v2 (x*20), booted once."""
    root = tmp_path_factory.mktemp("grpc")
    started = {v: Instance(write_echo(root, v, scale=int(v) * 10), root / f"{v}.log")
               for v in ("1", "2")}
    try:
        for instance in started.values():
            instance.wait_ready()
        yield started
    finally:
        for instance in started.values():
            instance.stop()
