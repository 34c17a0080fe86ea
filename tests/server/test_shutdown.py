"""Graceful shutdown on the real engine: SIGTERM lets in-flight requests finish, refuses new
ones, and reaps the engine's processes before exiting."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import LLM
from tests.support.harness import start_instance

pytestmark = pytest.mark.engine


def _assert_live_before_ready(instance) -> None:
    """The HTTP port answers liveness while the engine is still loading."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            live = httpx.get(f"{instance.http_url}/health", timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    assert live.status_code == 200
    ready = httpx.get(f"{instance.http_url}/health/ready", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "starting"


def test_sigterm_drains_in_flight_requests_then_reaps_engine(
        default_model_dir: Path, tmp_path: Path) -> None:
    from podium.package.defaults import write_default_package

    package = write_default_package(tmp_path / "pkg")
    instance = start_instance([str(package.root), "--shutdown-timeout", "60"],
                              tmp_path / "instance.log")
    try:
        _assert_live_before_ready(instance)
        instance.wait_ready()
        log = instance.log()
        assert "no API key configured" in log
        for step in ("open packages", "check engine", "resolve weights", "load plugins",
                     f"start engine {LLM}@1"):
            assert f"boot step {step} took" in log, step
        children = psutil.Process(instance.process.pid).children(recursive=True)
        assert children, "the engine core runs in a child process"
        results: list[httpx.Response | Exception] = []

        def generate() -> None:
            body = {"model": LLM, "prompt": "Tell a story:", "max_tokens": 48,
                    "ignore_eos": True, "temperature": 0}
            try:
                results.append(httpx.post(f"{instance.openai_url}/completions", json=body,
                                          timeout=120))
            except Exception as exc:  # recorded and asserted below
                results.append(exc)

        threads = [threading.Thread(target=generate) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the requests are in the engine now
        instance.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.HTTPError):  # no new requests once draining
            httpx.post(f"{instance.openai_url}/completions",
                       json={"model": LLM, "prompt": "x", "max_tokens": 1}, timeout=5)
        for thread in threads:
            thread.join(120)
        assert instance.process.wait(120) == 0
        assert len(results) == 4
        for result in results:
            assert isinstance(result, httpx.Response), result
            assert result.status_code == 200
            assert result.json()["usage"]["completion_tokens"] == 48
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"engine processes left running: {alive}"
        assert "draining" in instance.log()
    finally:
        instance.stop()


def test_dead_engine_stops_the_instance(default_model_dir: Path, tmp_path: Path) -> None:
    """If the engine core dies the instance exits 1 (a supervisor restarts it) instead of
    looking alive while answering 500 to everything."""
    from podium.package.defaults import write_default_package

    package = write_default_package(tmp_path / "pkg")
    instance = start_instance([str(package.root)], tmp_path / "instance.log")
    try:
        instance.wait_ready()
        for child in psutil.Process(instance.process.pid).children(recursive=True):
            child.kill()
        assert instance.process.wait(120) == 1
        assert "died" in instance.log()
    finally:
        instance.stop()
