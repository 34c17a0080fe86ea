"""Start a real `podium serve` process for tests and wait until it is ready."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PODIUM = [sys.executable, "-m", "podium.cli"]


@dataclass
class RunningInstance:
    """A `podium serve` subprocess on loopback ports."""

    process: subprocess.Popen
    http_port: int
    grpc_port: int
    log_path: Path
    api_key: str | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def openai_url(self) -> str:
        return f"{self.http_url}/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"podium serve exited with {self.process.returncode}:\n"
                                   f"{self.log()[-4000:]}")
            try:
                r = httpx.get(f"{self.http_url}/health/ready", headers=self.headers(), timeout=5)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"not ready after {timeout_s}s:\n{self.log()[-4000:]}")

    def stop(self, timeout_s: float = 120) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_instance(args: list[str], log_path: Path, *, api_key: str | None = None,
                   env: dict[str, str] | None = None,
                   new_session: bool = False) -> RunningInstance:
    """`new_session`: the server leads a process group of its own, which a test may signal
    whole (as Ctrl-C or `timeout` do) without signalling itself."""
    http_port, grpc_port = free_port(), free_port()
    command = [*PODIUM, "serve", *args, "--host", "127.0.0.1", "--http-port", str(http_port),
               "--grpc-port", str(grpc_port)]
    if api_key:
        command += ["--api-key", api_key]
    log_file = log_path.open("wb")
    base = {k: v for k, v in os.environ.items() if k != "PODIUM_CONSTRAINT_COMPILER"}
    process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                               env={**base, **(env or {})}, cwd=ROOT,  # the real default
                               start_new_session=new_session)
    return RunningInstance(process, http_port, grpc_port, log_path, api_key)


@contextmanager
def running_instance(args: list[str], log_path: Path, **kwargs) -> Iterator[RunningInstance]:
    instance = start_instance(args, log_path, **kwargs)
    try:
        instance.wait_ready()
        yield instance
    finally:
        instance.stop()
