"""The zygote without an engine (it imports `json` and prometheus_client, not vLLM): a process
forked from it has its own environment, session, niceness, title and metrics storage, not the
zygote's, and one thread; it waits at the gate like a spawned instance; its engine preloader is
forked from the zygote too; a zygote that crashed or cannot serve an instance is restarted or
bypassed with a warning, and the instance starts as a plain process."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podium.control.runtime.detached import open_gate
from podium.preload.spawn import Zygote, ZygoteProcess

CHILD = Path(__file__).parents[1] / "support" / "zygote_child.py"


def wait_for(condition: object, timeout_s: float = 30.0, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, ("condition not reached", log and log.read_text(
            errors="replace")[-3000:])
        time.sleep(0.05)


@pytest.fixture
def zygote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Zygote]:
    monkeypatch.setenv("ZYGOTE_ONLY", "the zygote's")
    found = Zygote(tmp_path, modules=["json", "prometheus_client"])
    found.start()
    wait_for(found.ready)
    yield found
    found.stop()


def instance_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ZYGOTE_ONLY"}
    metrics = tmp_path / "instance-metrics"
    metrics.mkdir(exist_ok=True)
    return {**env, "PODIUM_HOME": str(tmp_path / "instance-home"), "INSTANCE_ONLY": "yes",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics)}


def spawn(zygote: Zygote, tmp_path: Path, *args: str, nice: int = 7) -> tuple[ZygoteProcess, Path]:
    out = tmp_path / "child.json"
    with (tmp_path / "child.log").open("ab") as log:
        child = zygote.spawn([str(CHILD), str(out), *args], out=log, env=instance_env(tmp_path),
                             nice=nice)
    assert child is not None
    return child, out


def test_an_instance_gets_its_own_environment_session_and_niceness(
        zygote: Zygote, tmp_path: Path) -> None:
    child, out = spawn(zygote, tmp_path)
    time.sleep(0.2)
    assert not out.exists()  # at its gate: nothing runs before the pid is recorded
    open_gate(child, lambda: None)  # type: ignore[arg-type]
    wait_for(out.exists, log=tmp_path / "child.log")
    found = json.loads(out.read_text())
    assert found["env"] == instance_env(tmp_path)  # not one variable of the zygote's
    assert found["pid"] == child.pid and found["ppid"] == zygote.process.pid  # type: ignore[union-attr]
    assert found["sid"] == child.pid  # a session of its own: outlives the control plane
    assert found["nice"] == 7
    assert found["threads"] == 1
    assert found["frozen"] > 0  # the zygote's import heap, out of the collector's reach
    assert found["multiprocess_metrics"]  # prometheus_client's storage follows the instance's
    assert found["metric_files"] == [f"counter_{child.pid}.db"]
    assert str(CHILD) in found["cmdline"]  # its command as its title (adoption reads it)
    wait_for(lambda: child.poll() is not None)
    assert child.poll() == 0


def test_metrics_made_in_the_zygote_and_in_the_instance_share_its_files_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values made in the zygote (at import, as Podium's and vLLM's are) and values made in the
    instance go to the instance's files through one value class: the directory reads back, every
    value in it. (With a second class made in the instance, both mapped one file, each appended
    over the other's entries, and reading it failed with a UnicodeDecodeError: an autoscaled
    instance's /metrics answered 500.)"""
    found = Zygote(tmp_path, modules=["json", "prometheus_client", "tests.support.zygote_metrics"])
    found.start()
    try:
        wait_for(found.ready)
        child, out = spawn(found, tmp_path, "metrics")
        open_gate(child, lambda: None)  # type: ignore[arg-type]
        wait_for(out.exists, log=tmp_path / "child.log")
    finally:
        found.stop()
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["preloaded"]  # the values were made in the zygote
    assert "error" not in metrics, metrics.get("error")
    text = metrics["text"]
    assert "zygote_made_at_import_total 2.0" in text
    codes = ["200", *map(str, range(300, 320))]
    lines = [f'zygote_labelled_total{{code="{code}"}} 1.0' for code in codes]
    assert [line for line in lines if line not in text] == []
    assert f"counter_{child.pid}.db" in os.listdir(tmp_path / "instance-metrics")


def test_an_instances_exit_status_is_known(zygote: Zygote, tmp_path: Path) -> None:
    child, _ = spawn(zygote, tmp_path, "exit", "3")
    open_gate(child, lambda: None)  # type: ignore[arg-type]
    wait_for(lambda: child.poll() is not None)
    assert child.poll() == 3  # a supervisor tells a crash from a clean exit
    killed, _ = spawn(zygote, tmp_path)
    os.kill(killed.pid, signal.SIGKILL)
    wait_for(lambda: killed.poll() is not None)
    assert killed.poll() == -signal.SIGKILL


def test_an_instance_whose_gate_closes_without_go_never_starts(
        zygote: Zygote, tmp_path: Path) -> None:
    child, out = spawn(zygote, tmp_path)
    child.stdin.close()  # the control plane died before recording it
    wait_for(lambda: child.poll() is not None)
    assert not out.exists()


def test_the_instances_engine_preloader_is_forked_from_the_zygote(
        zygote: Zygote, tmp_path: Path) -> None:
    child, out = spawn(zygote, tmp_path, "preloader")
    open_gate(child, lambda: None)  # type: ignore[arg-type]
    wait_for(out.exists, 60, log=tmp_path / "child.log")
    found = json.loads(out.read_text())
    assert "forked from the zygote" in found["preloader"]
    assert f"podium engine preloader of server {child.pid}" in found["preloader_title"]
    engine = found["engine"]
    assert engine["ppid"] == found["preloader_pid"]  # the engine core's parent: the preloader
    assert engine["env"]["INSTANCE_ONLY"] == "yes"  # the server's environment, not the zygote's
    assert "ZYGOTE_ONLY" not in engine["env"]


def test_a_crashed_zygote_is_restarted_and_the_instance_starts_plain(
        zygote: Zygote, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = zygote.process.pid  # type: ignore[union-attr]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not zygote.alive())
    with caplog.at_level(logging.WARNING, logger="podium.preload"), \
            (tmp_path / "child.log").open("ab") as log:
        assert zygote.spawn([str(CHILD), "x"], out=log, env=instance_env(tmp_path)) is None
    assert f"zygote (pid {old}) exited" in caplog.text
    wait_for(zygote.ready)  # restarted: the next instance forks from the new one
    child, out = spawn(zygote, tmp_path)
    open_gate(child, lambda: None)  # type: ignore[arg-type]
    wait_for(out.exists)


def test_a_zygote_that_cannot_answer_is_bypassed_then_restarted(
        zygote: Zygote, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    os.unlink(zygote.socket)
    (tmp_path / "zygote.sock").write_text("not a socket")
    old = zygote.process.pid  # type: ignore[union-attr]
    with caplog.at_level(logging.WARNING, logger="podium.preload"), \
            (tmp_path / "child.log").open("ab") as log:
        assert zygote.spawn([str(CHILD), "x"], out=log, env=instance_env(tmp_path)) is None
    assert "did not fork the instance" in caplog.text
    wait_for(zygote.ready)
    assert zygote.process.pid != old  # type: ignore[union-attr]


def test_an_instance_whose_load_time_variables_differ_starts_plain(
        zygote: Zygote, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    env = {**instance_env(tmp_path), "OMP_NUM_THREADS": "3"}
    with caplog.at_level(logging.WARNING, logger="podium.preload"), \
            (tmp_path / "child.log").open("ab") as log:
        assert zygote.spawn([str(CHILD), "x"], out=log, env=env) is None
    assert "zygote bypassed" in caplog.text and "OMP_NUM_THREADS" in caplog.text


def test_the_zygote_exits_when_its_stdin_closes(zygote: Zygote) -> None:
    process = zygote.process
    assert process is not None and process.stdin is not None
    process.stdin.close()  # what a control plane's death does
    process.wait(10)
    assert not os.path.exists(zygote.socket)
