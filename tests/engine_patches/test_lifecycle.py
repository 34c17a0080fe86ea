"""`engine_patches.lifecycle` on real processes, without an engine: a process whose parent is
the server named in PODIUM_ENGINE_PARENT leaves the server's process group and is sent SIGTERM
when the server is gone; any other process is left alone. The real engine's case is in
`tests/server/test_shutdown.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from podium.engine_patches import lifecycle
from tests.support.polling import eventually

# The "engine core": registers the plugin, says its process group, and records a SIGTERM.
ENGINE = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    def stop(signum, frame):
        out.with_suffix(".term").write_text("SIGTERM")
        sys.exit(0)
    def group(signum, frame):
        out.with_suffix(".group").write_text("the group's signal reached the engine")
        sys.exit(1)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, group)
    from podium.engine_patches import lifecycle
    lifecycle.register()
    out.write_text(str(os.getpgrp()))
    time.sleep(60)
""")
# The "server": sets PODIUM_ENGINE_PARENT to itself (or not), starts the engine, waits.
SERVER = textwrap.dedent("""
    import os, subprocess, sys, time
    if sys.argv[2] == "server":
        os.environ["PODIUM_ENGINE_PARENT"] = str(os.getpid())
    subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1]])
    time.sleep(60)
""")


def _start(tmp_path: Path, parent: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "engine.pgrp"
    env = {k: v for k, v in os.environ.items() if k != lifecycle.PARENT_ENV}
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(out), parent, ENGINE],
                              env=env, start_new_session=True)
    assert eventually(lambda: out.exists() and out.read_text(), 30), \
        "the engine process did not start"
    return server, out


def _engine(server: subprocess.Popen) -> psutil.Process:
    (engine,) = psutil.Process(server.pid).children()
    return engine


def test_the_engine_core_leaves_the_group_and_stops_when_its_server_is_killed(
        tmp_path: Path) -> None:
    server, out = _start(tmp_path, "server")
    engine = _engine(server)
    try:
        assert int(out.read_text()) == engine.pid != os.getpgid(server.pid)
        # a signal to the server's group (as Ctrl-C sends SIGINT; SIGUSR1 here, which a
        # background job does not ignore, and which kills the server) reaches the server alone
        os.killpg(server.pid, signal.SIGUSR1)
        server.wait(10)
        engine.wait(10)  # its server is gone: SIGTERM, which it handles by exiting
        assert not out.with_suffix(".group").exists()
        assert out.with_suffix(".term").read_text() == "SIGTERM"
    finally:
        server.kill()
        if engine.is_running():
            engine.kill()


def test_the_engine_core_of_a_server_killed_outright_stops_too(tmp_path: Path) -> None:
    server, out = _start(tmp_path, "server")
    engine = _engine(server)
    try:
        server.kill()
        server.wait(10)
        engine.wait(10)
        assert out.with_suffix(".term").read_text() == "SIGTERM"
    finally:
        if engine.is_running():
            engine.kill()


def test_a_process_no_podium_server_started_is_left_alone(tmp_path: Path) -> None:
    """A plain `vllm serve` on a host with Podium installed: the plugin does nothing."""
    server, out = _start(tmp_path, "other")
    engine = _engine(server)
    try:
        assert int(out.read_text()) == os.getpgid(server.pid)
        server.kill()
        server.wait(10)
        time.sleep(1.5)
        assert engine.is_running() and not out.with_suffix(".term").exists()
    finally:
        engine.kill()


@pytest.mark.parametrize("value", ["", "x", "0"])
def test_only_the_servers_own_child_acts(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lifecycle.PARENT_ENV, value)
    assert lifecycle._server_pid() is None
    monkeypatch.setenv(lifecycle.PARENT_ENV, str(os.getpid()))  # the server itself
    assert lifecycle._server_pid() is None
    monkeypatch.setenv(lifecycle.PARENT_ENV, str(os.getppid()))
    assert lifecycle._server_pid() == os.getppid()
