"""Processes that outlive the control plane, and none it did not record.

A local instance, a Ray host's instance and a `podium up` gateway are each started in their own
session (a crash or `kill -9` of the plane leaves them serving; the next plane adopts them),
behind a gate (`GATE`) that waits on a pipe from the plane. The plane records the pid first
(`open_gate`), then says "go"; a plane that dies before that closes the pipe with its death, and
the gated process exits without ever starting.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

# run as `python -I -c GATE COMMAND...`: wait for "go" on stdin, then become COMMAND (same pid)
GATE = """
import os, sys
if sys.stdin.buffer.readline() != b"go\\n":
    sys.exit(0)  # the control plane died before it recorded this pid: never start
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
os.execvp(sys.argv[1], sys.argv[1:])
"""


def spawn_gated(command: list[str], *, out: IO[bytes],
                env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `command` in its own session, waiting at the gate (it has not run yet)."""
    return subprocess.Popen(
        [sys.executable, "-I", "-c", GATE, *command], stdout=out, stderr=subprocess.STDOUT,
        stdin=subprocess.PIPE, env=None if env is None else dict(env),
        start_new_session=True)  # survives a control-plane crash; adopted on restart


def open_gate(process: subprocess.Popen[bytes], record: Callable[[], object]) -> None:
    """Record the process (`record` raises: it exits unstarted), then let it start."""
    assert process.stdin is not None
    try:
        record()
        process.stdin.write(b"go\n")  # recorded: now it may start, and outlive us
    finally:
        with contextlib.suppress(OSError):
            process.stdin.close()  # without "go" (the record failed) it exits unstarted


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); it is dead for our purposes
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True
