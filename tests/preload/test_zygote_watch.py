"""A server forked from the zygote with its gate watched (a Ray host's instance,
`podium.control.runtime.ray_zygote`): it runs once told "go", and the kernel sends it SIGTERM
when the gate's writer closes (its host actor died), whether that happens while it runs or
before it armed the watch. Without the watch (the local runtime's gate) it outlives the writer.
The zygote imports `json` here, not vLLM."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podium.preload.spawn import Zygote, ZygoteProcess, fork_server

SCRIPT = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("running")
time.sleep(float(sys.argv[2]))
pathlib.Path(sys.argv[1]).write_text("finished")
"""


def wait_for(condition: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[Zygote]:
    found = Zygote(tmp_path, modules=["json"])
    found.start()
    wait_for(found.ready)
    yield found
    found.stop()


def fork(zygote: Zygote, tmp_path: Path, sleep_s: float, *,
         watch: bool) -> tuple[ZygoteProcess, Path]:
    script, out = tmp_path / "child.py", tmp_path / "child.txt"
    script.write_text(SCRIPT)
    with (tmp_path / "child.log").open("ab") as log:
        child = fork_server(zygote.socket, [str(script), str(out), str(sleep_s)], out=log,
                            env={"PATH": "/usr/bin:/bin"}, watch=watch)
    return child, out


def test_a_watched_server_gets_sigterm_when_its_gate_writer_closes(
        zygote: Zygote, tmp_path: Path) -> None:
    child, out = fork(zygote, tmp_path, 120, watch=True)
    child.stdin.write(b"go\n")  # the gate stays open: the host actor lives
    wait_for(out.exists)
    assert child.poll() is None
    child.stdin.close()  # what the host actor's death does
    wait_for(lambda: child.poll() is not None)
    assert child.poll() == -signal.SIGTERM  # the status the zygote recorded
    assert out.read_text() == "running"


def test_a_writer_gone_before_the_watch_is_armed_still_stops_the_server(
        zygote: Zygote, tmp_path: Path) -> None:
    child, _ = fork(zygote, tmp_path, 120, watch=True)
    child.stdin.write(b"go\n")
    child.stdin.close()  # before the child has read "go": no signal is sent for this close
    wait_for(lambda: child.poll() is not None)
    assert child.poll() == -signal.SIGTERM


def test_an_unwatched_server_outlives_its_gate_writer(zygote: Zygote, tmp_path: Path) -> None:
    child, out = fork(zygote, tmp_path, 0.5, watch=False)
    child.stdin.write(b"go\n")
    child.stdin.close()  # the local runtime closes its gate at once: the server runs on
    wait_for(lambda: child.poll() is not None)
    assert child.poll() == 0
    assert out.read_text() == "finished"


def test_a_watched_server_never_told_go_exits_unstarted(zygote: Zygote, tmp_path: Path) -> None:
    child, out = fork(zygote, tmp_path, 0.5, watch=True)
    child.stdin.close()
    wait_for(lambda: child.poll() is not None)
    assert child.poll() == 0
    assert not out.exists()
