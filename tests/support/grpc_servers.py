"""Real `podium serve` instances of the echo model, and the gRPC gateway in front of them."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from podium.control.runtime.local import serve_command
from podium.gateway.grpc_proxy import GrpcGateway
from podium.routes.stats import VersionStats
from podium.routes.table import Endpoint, RouteTable
from tests.support.ports import free_port


class Instance:
    """One `podium serve` process of the echo model."""

    def __init__(self, package: Path, log: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.process = subprocess.Popen(serve_command(str(package), self.http_port,
                                                      self.grpc_port),
                                        stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.http_port}/health/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and self.process.poll() is None, "not ready"
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


class GrpcFront:
    """The gRPC gateway on its own event loop thread."""

    def __init__(self, table: RouteTable, **options: Any) -> None:
        self.gateway = GrpcGateway(table, VersionStats(), **options)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server, port = asyncio.run_coroutine_threadsafe(
            self.gateway.serve("127.0.0.1", 0), self.loop).result(10)
        self.target = f"127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        asyncio.run_coroutine_threadsafe(self.gateway.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def echo_table(instances: dict[str, Instance]) -> RouteTable:
    """Both echo versions routed (split all to 1, `latest` is 2)."""
    table = RouteTable()
    for version, instance in instances.items():
        table.add_endpoint("echo", version, Endpoint(
            f"echo-{version}", f"http://127.0.0.1:{instance.http_port}",
            grpc_target=f"127.0.0.1:{instance.grpc_port}"))
    table.set_split("echo", {"1": 100})
    table.set_alias("echo", "latest", "2")
    return table
