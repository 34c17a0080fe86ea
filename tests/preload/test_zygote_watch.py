"""A server forked from the zygote with its gate watched (a Ray host's instance,
`podium.control.runtime.ray_zygote`): it runs once told "go", and the kernel sends it SIGTERM
when the gate's writer closes (its host actor died), whether that happens while it runs or
before it armed the watch. Without the watch (the local runtime's gate) it outlives the writer.
The zygote imports `json` here, not vLLM."""

from __future__ import annotations

import signal
from pathlib import Path

from podium.preload.spawn import Zygote, ZygoteProcess, fork_server
from tests.support.json_zygote import zygote
from tests.support.polling import eventually

__all__ = ["zygote"]  # a real zygote preloading json (a fixture)

SCRIPT = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("running")
time.sleep(float(sys.argv[2]))
pathlib.Path(sys.argv[1]).write_text("finished")
"""


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
    # "running" written, not only the file made: a SIGTERM between the two leaves it empty
    assert eventually(lambda: out.exists() and out.read_text() == "running", timeout_s=30)
    assert child.poll() is None
    child.stdin.close()  # what the host actor's death does
    assert eventually(lambda: child.poll() is not None, timeout_s=30)
    assert child.poll() == -signal.SIGTERM  # the status the zygote recorded
    assert out.read_text() == "running"


def test_a_writer_gone_before_the_watch_is_armed_still_stops_the_server(
        zygote: Zygote, tmp_path: Path) -> None:
    child, _ = fork(zygote, tmp_path, 120, watch=True)
    child.stdin.write(b"go\n")
    child.stdin.close()  # before the child has read "go": no signal is sent for this close
    assert eventually(lambda: child.poll() is not None, timeout_s=30)
    assert child.poll() == -signal.SIGTERM


def test_an_unwatched_server_outlives_its_gate_writer(zygote: Zygote, tmp_path: Path) -> None:
    child, out = fork(zygote, tmp_path, 0.5, watch=False)
    child.stdin.write(b"go\n")
    child.stdin.close()  # the local runtime closes its gate at once: the server runs on
    assert eventually(lambda: child.poll() is not None, timeout_s=30)
    assert child.poll() == 0
    assert out.read_text() == "finished"


def test_a_watched_server_never_told_go_exits_unstarted(zygote: Zygote, tmp_path: Path) -> None:
    child, out = fork(zygote, tmp_path, 0.5, watch=True)
    child.stdin.close()
    assert eventually(lambda: child.poll() is not None, timeout_s=30)
    assert child.poll() == 0
    assert not out.exists()
