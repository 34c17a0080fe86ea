"""A fresh `podium up` for a bench: its own PODIUM_HOME (the session's model cache), ports,
and a clean stop; plus the polling wait such benches use against its API."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from podium.ports import free_port


@dataclass(frozen=True)
class Up:
    home: Path
    env: dict[str, str]
    api: str
    gateway: str
    cli: list[str]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 600) -> None:
    """Poll `condition` every 0.2 s (an HTTP or shape error counts as not yet) until true;
    RuntimeError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


@contextmanager
def fresh_up(prefix: str, extra_env: Mapping[str, str] | None = None) -> Iterator[Up]:
    """`podium up` on free loopback ports with a new home (log: HOME/up.log), its API
    answering; terminated (killed after 120 s) on exit."""
    from podium.package.cache import ModelCache

    home = Path(tempfile.mkdtemp(prefix=prefix))
    api_port, http_port = free_port(), free_port()
    env = {**os.environ, "PODIUM_HOME": str(home), "PODIUM_CACHE": str(ModelCache().root),
           "HF_HUB_OFFLINE": "1", **(extra_env or {})}
    cli = [sys.executable, "-m", "podium.cli"]
    with (home / "up.log").open("ab") as log:
        up = subprocess.Popen([*cli, "up", "--host", "127.0.0.1", "--http-port", str(http_port),
                               "--api-port", str(api_port), "--grpc-port", str(free_port())],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{api_port}"
    try:
        wait_for(lambda: httpx.get(api + "/health", timeout=2).status_code == 200, "the API")
        yield Up(home, env, api, f"http://127.0.0.1:{http_port}", cli)
    finally:
        up.terminate()
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
