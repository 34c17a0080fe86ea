"""Graceful shutdown on the real engine: SIGTERM lets in-flight requests finish, refuses new
ones, and reaps the engine's processes before exiting, even when the signal goes to the whole
process group. On the suite's spare instance (tests/support/spare.py), which this ends; the
suite starts no instance here for the other two paths: a server killed outright takes its
engine with it (tests/server/test_standalone_real.py, on its instance once done serving); a
dead engine stops its instance with exit 1 (tests/control/test_e2e_llm.py, which kills one
under load)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading

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
        streams = [_Stream(instance.openai_url) for _ in range(4)]
        for stream in streams:
            stream.thread.start()
        # in flight = its first token reached the client (a fixed sleep let a loaded CI host
        # signal before the 4th request connected, and the server's in-flight gauge read 0 of
        # 4 there for 60 s, with nothing to say why): the streams themselves say
        _wait_streaming(streams)
        os.killpg(group, signal.SIGTERM)
        assert eventually(lambda: "draining" in instance.log(), timeout_s=10), \
            "the server never said it was draining"
        # uvicorn closes its listener at its next tick (0.1 s) after the signal
        assert eventually(lambda: not _accepts(instance.http_port), timeout_s=5)
        with pytest.raises(httpx.HTTPError):  # no new requests once draining
            httpx.post(f"{instance.openai_url}/completions",
                       json={"model": LLM, "prompt": "x", "max_tokens": 1}, timeout=5)
        for stream in streams:
            stream.thread.join(120)
        assert instance.process.wait(120) == 0
        for stream in streams:  # each finished its whole answer after the signal
            assert stream.error is None, stream.error
            assert stream.done and stream.completion_tokens == 128, vars(stream)
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


class _Stream:
    """One streamed completion of 128 tokens in a thread: when its first token arrived, how
    many its usage says it produced, whether `[DONE]` ended it, or what broke it."""

    def __init__(self, openai_url: str) -> None:
        self.url = f"{openai_url}/completions"
        self.first_token = threading.Event()
        self.completion_tokens: int | None = None
        self.done = False
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": LLM, "prompt": "Tell a story:", "max_tokens": 128, "ignore_eos": True,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        try:
            with httpx.stream("POST", self.url, json=body, timeout=120) as response:
                if response.status_code != 200:
                    self.error = f"{response.status_code} {response.read()[:500]!r}"
                    return
                for line in response.iter_lines():
                    self._read(line)
        except Exception as exc:  # recorded and asserted by the test
            self.error = repr(exc)
        finally:
            self.first_token.set()  # the waiter reads `error` then

    def _read(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        if line == "data: [DONE]":
            self.done = True
            return
        chunk = json.loads(line[len("data: "):])
        if chunk.get("choices"):
            self.first_token.set()
        if chunk.get("usage"):
            self.completion_tokens = chunk["usage"]["completion_tokens"]


def _wait_streaming(streams: list[_Stream], timeout_s: float = 120) -> None:
    """Until every stream has its first token, failing at once with what broke one."""
    for stream in streams:
        assert stream.first_token.wait(timeout_s), f"no first token in {timeout_s} s"
        assert stream.error is None, stream.error
        assert not stream.done, "a stream ended before the signal: 128 tokens were too few"
