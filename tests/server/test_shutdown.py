"""Graceful shutdown on the real engine: SIGTERM lets in-flight requests finish, refuses new
ones, and reaps the engine's processes before exiting, even when the signal goes to the whole
process group. On the suite's spare instance (tests/support/spare.py), which this ends; the
suite starts no instance here for the other two paths: a server killed outright takes its
engine with it (tests/server/test_standalone_real.py, on its instance once done serving); a
dead engine stops its instance with exit 1 (tests/control/test_e2e_llm.py, which kills one
under load)."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time

import httpx
import psutil
import pytest

from tests.conftest import LLM
from tests.support.polling import eventually
from tests.support.spare import BootSeen, Spare

pytestmark = pytest.mark.engine
ENDS_SPARE_INSTANCE = True  # tests/conftest.py runs it after the spare instance's other users


def _assert_live_before_ready(seen: BootSeen) -> None:
    """The HTTP port answered liveness while the engine was still loading."""
    assert seen.live_status == 200
    assert seen.ready_status == 503 and seen.ready_body["status"] == "starting"


def test_sigterm_drains_in_flight_requests_then_reaps_engine(spare_instance: Spare) -> None:
    """The stop signal goes to the server's whole process group, as Ctrl-C in a terminal,
    `timeout` and a group kill send it: the engine core is in a group of its own
    (`engine_patches.lifecycle`), so only the server stops it, after the drain. Without that,
    its worker exited at once and the in-flight requests were answered 503."""
    instance, seen = spare_instance.take()
    try:
        _assert_live_before_ready(seen)
        log = instance.log()
        assert "no API key configured" in log
        for step in ("open packages", "check engine", "resolve weights", "load plugins",
                     f"start engine {LLM}@1"):
            assert f"boot step {step} took" in log, step
        children = psutil.Process(instance.process.pid).children(recursive=True)
        assert children, "the engine core runs in a child process"
        group = os.getpgid(instance.process.pid)
        assert group == instance.process.pid
        engine = [c for c in children if c.name().startswith("VLLM::")]  # core, worker
        assert engine, [c.name() for c in children]
        assert all(os.getpgid(c.pid) != group for c in engine), \
            "the engine's processes left the server's process group"
        results: list[httpx.Response | Exception] = []

        def generate() -> None:
            body = {"model": LLM, "prompt": "Tell a story:", "max_tokens": 96,
                    "ignore_eos": True, "temperature": 0}
            try:
                results.append(httpx.post(f"{instance.openai_url}/completions", json=body,
                                          timeout=120))
            except Exception as exc:  # recorded and asserted below
                results.append(exc)

        threads = [threading.Thread(target=generate) for _ in range(4)]
        for thread in threads:
            thread.start()
        # a fixed sleep let a loaded CI host send SIGTERM before the 4th request connected:
        # that one was refused (no new requests once draining), which is right, not a failure
        _wait_in_flight(instance, 4)
        os.killpg(group, signal.SIGTERM)
        assert eventually(lambda: "draining" in instance.log(), timeout_s=10), \
            "the server never said it was draining"
        # uvicorn closes its listener at its next tick (0.1 s) after the signal
        assert eventually(lambda: not _accepts(instance.http_port), timeout_s=5)
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
            assert result.json()["usage"]["completion_tokens"] == 96
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"engine processes left running: {alive}"
        log = instance.log()
        assert "draining" in log
        assert "force killing" not in log, "vLLM's shutdown was cut short (ENGINE_STOP_S)"
        errors = [line for line in log.splitlines() if re.search(r"\bERROR\b", line)]
        assert not errors, f"a clean stop logged errors: {errors}"
    finally:
        instance.stop()


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_in_flight(instance, count: int, timeout_s: float = 60) -> None:
    """Until the server is serving `count` completions at once (its own in-flight gauge)."""
    deadline = time.monotonic() + timeout_s
    in_flight = 0.0
    while time.monotonic() < deadline:
        text = httpx.get(f"{instance.http_url}/metrics", timeout=10).text
        in_flight = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith("podium:requests_in_flight{")
                        and 'endpoint="/v1/completions"' in line)
        if in_flight >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{in_flight:.0f} of {count} requests in flight after {timeout_s} s")
