"""The preloader without an engine: a process started through it gets the starting process's
environment (not the preloader's), is watched through its pidfd, and a preloader that is gone
is bypassed with a warning (the process is spawned)."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path

import pytest

from podium.preload import process, server
from podium.preload.environment import engine_env, load_time_drift
from tests.support.polling import eventually


def report(path: str) -> None:
    """The child: its environment, pid and parent."""
    Path(path).write_text(json.dumps({"env": dict(os.environ), "pid": os.getpid(),
                                      "ppid": os.getppid()}))


@pytest.fixture
def preloader(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(server, "PRELOAD_MODULE", "json")  # the machinery, not vLLM's import
    monkeypatch.delenv(server.PRELOAD_ENV, raising=False)
    for key, value in engine_env(os.environ).items():  # as vLLM's CPU platform sets them
        monkeypatch.setenv(key, value)
    line = server.start()
    pid = server.pid()
    assert pid is not None, line
    yield pid
    server.stop()


def _run(tmp_path: Path) -> dict:
    out = tmp_path / "child.json"
    proc = process.PreloadedContext().Process(target=report, args=(str(out),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    return json.loads(out.read_text())


def test_a_child_gets_the_environment_at_its_start_not_the_preloaders(
        preloader: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # set after the preloader started
    monkeypatch.setenv("PODIUM_TEST_LATE", "yes")
    child = _run(tmp_path)
    assert child["ppid"] == preloader  # forked by the preloader
    env = child["env"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["PODIUM_TEST_LATE"] == "yes"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == process.WORKER_METHOD
    preloader_env = (Path(f"/proc/{preloader}/environ").read_bytes().split(b"\0"))
    assert b"PODIUM_TEST_LATE=yes" not in preloader_env


def test_a_child_that_exits_before_its_parent_reads_its_pid_is_not_started_again(
        preloader: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The fork server forks the child, the child runs and exits and the fork server reaps
    it, all before the parent (slow: a loaded machine, a niced server) reads the pid: the
    parent watches the exit status the fork server reports; the preloader is not bypassed and
    the child is not spawned a second time."""
    read_signed = forkserver.read_signed
    late = {"pid": 0}

    def read_late(fd: int) -> int:
        value = read_signed(fd)
        if not late["pid"]:  # the child's pid: come back once it is gone
            late["pid"] = value
            eventually(lambda: not os.path.exists(f"/proc/{value}"), timeout_s=30)
        return value

    monkeypatch.setattr(forkserver, "read_signed", read_late)
    with caplog.at_level(logging.WARNING, logger="podium.preload"):
        child = _run(tmp_path)
    assert child["pid"] == late["pid"] and child["ppid"] == preloader  # the one it forked
    assert "bypassed" not in caplog.text
    assert server.pid() == preloader


def test_the_preloader_runs_one_thread(preloader: int) -> None:
    time.sleep(0.5)
    assert len(os.listdir(f"/proc/{preloader}/task")) == 1


def test_a_killed_preloader_is_bypassed_with_a_warning(
        preloader: int, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    os.kill(preloader, signal.SIGKILL)
    time.sleep(0.2)
    with caplog.at_level(logging.WARNING, logger="podium.preload"):
        child = _run(tmp_path)
    assert child["ppid"] == os.getpid()  # spawned by this process
    assert "engine preloader bypassed" in caplog.text
    assert server.pid() is None


def test_load_time_variables_that_differ_bypass_the_preloader(
        preloader: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # read by OpenMP when it loads
    with caplog.at_level(logging.WARNING, logger="podium.preload"):
        child = _run(tmp_path)
    assert child["ppid"] == os.getpid()
    assert child["env"]["OMP_NUM_THREADS"] == "7"
    assert "OMP_NUM_THREADS" in caplog.text


def test_the_engine_environment_is_what_vllms_cpu_platform_sets() -> None:
    env = engine_env({"PATH": "/bin"})
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "libgomp" in env.get("LD_PRELOAD", "libgomp")
    assert load_time_drift(env, {**env, "VLLM_X": "1"}) == []
    assert load_time_drift(env, {**env, "LD_PRELOAD": "x"}) == ["LD_PRELOAD"]


def test_off_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(server.PRELOAD_ENV, "0")
    assert server.start() == "off (PODIUM_PRELOAD=0)"
    assert server.pid() is None
