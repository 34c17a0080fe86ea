"""Start benchmark servers as child processes and wait until they report ready."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(command: list[str], http_port: int, *, cwd: Path | None = None,
          timeout_s: float = 120, env: dict[str, str] | None = None,
          ready_path: str = "/v2/health/ready", poll_s: float = 0.25,
          stop_timeout_s: float = 15) -> Iterator[None]:
    """Run `command` until the block ends; ready means GET `ready_path` answers 200."""
    process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})},
                               start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{http_port}{ready_path}").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(command)} not ready after {timeout_s} s")
            time.sleep(poll_s)
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the whole group: MLServer forks workers
        try:
            process.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

def podium_command(repository: Path, http_port: int, grpc_port: int, models: list[str]
                   ) -> list[str]:
    return [sys.executable, str(BENCH / "kserve_server.py"), "--repository", str(repository),
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), *models]


def serve_openai(command: list[str], port: int, *, timeout_s: float = 600
                 ) -> contextlib.AbstractContextManager[None]:
    """Run an OpenAI-compatible server until the block ends; ready means GET /health is 200."""
    return serve(command, port, timeout_s=timeout_s, ready_path="/health", poll_s=1,
                 stop_timeout_s=30)
