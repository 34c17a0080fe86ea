"""`podium up`'s gateway processes on their own: recorded before they start, adopted by the next
plane when they still run the same command, replaced when they do not, restarted when they die,
stopped (killed past the timeout) on the way out."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from podium.control.gateways import GatewayProcesses
from podium.errors import InvalidArgument
from tests.support.ports import free_port
from tests.support.up_process import alive, wait

IDLE = [sys.executable, "-c", "import time; time.sleep(120)"]
DEAF = [sys.executable, "-c",  # ignores SIGTERM: only the kill at the timeout stops it
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]


def _processes(home: Path, commands: list[list[str]]) -> GatewayProcesses:
    gateways = GatewayProcesses(home, commands)
    gateways.adopt(host="127.0.0.1", port=free_port())  # a free port for the stranger check
    gateways.start()
    return gateways


def test_a_restarted_plane_adopts_running_gateways_instead_of_starting_more(
        tmp_path: Path) -> None:
    first = _processes(tmp_path, [IDLE, IDLE])
    pids = first.pids()
    wait(lambda: all(_runs_command(p) for p in pids), what="both gateways")
    second = _processes(tmp_path, [IDLE, IDLE])  # the plane died (no stop) and came back
    try:
        assert second.pids() == pids
        assert sorted((tmp_path / "gateways").glob("*.json")) == [
            tmp_path / "gateways" / "gateway-0.json", tmp_path / "gateways" / "gateway-1.json"]
    finally:
        second.stop(timeout_s=5)
    # an adopted gateway is not this process's child: stop judges it gone once it no longer
    # runs its command, which is already so while the kernel finishes its exit (its command
    # line reads empty then); the test waits out that last step instead of racing it
    wait(lambda: not any(alive(p) for p in pids), what="the adopted gateways' exit",
         timeout_s=10)
    assert list((tmp_path / "gateways").glob("*.json")) == []


def test_a_gateway_running_another_command_is_replaced(tmp_path: Path) -> None:
    first = _processes(tmp_path, [IDLE, IDLE])
    old = first.pids()
    wait(lambda: all(_runs_command(p) for p in old), what="both gateways")
    second = _processes(tmp_path, [[*IDLE, "other-port"]])  # one gateway now, another command
    try:
        [new] = second.pids()
        assert new not in old
        wait(lambda: not any(alive(p) for p in old), what="the old gateways retired")
    finally:
        second.stop(timeout_s=5)


def test_a_dead_gateway_is_restarted(tmp_path: Path) -> None:
    gateways = _processes(tmp_path, [IDLE])
    [pid] = gateways.pids()
    try:
        os.kill(pid, signal.SIGKILL)
        # restarts are at least a second apart: the wait polls until there is one
        wait(lambda: (gateways.poll(), gateways.pids() != [pid])[1], what="the restart")
        assert alive(gateways.pids()[0])
    finally:
        gateways.stop(timeout_s=5)


def test_a_gateway_that_exits_once_the_stop_began_is_not_restarted(tmp_path: Path) -> None:
    gateways = _processes(tmp_path, [IDLE])
    [pid] = gateways.pids()
    gateways.terminate()  # podium up got SIGTERM: the gateway drains and exits
    wait(lambda: not alive(pid), what="the gateway's exit", timeout_s=10)
    time.sleep(1.1)
    gateways.poll()
    assert gateways.pids() == [pid]
    gateways.stop(timeout_s=5)


def test_stop_kills_a_gateway_that_does_not_stop_in_time(tmp_path: Path) -> None:
    gateways = _processes(tmp_path, [DEAF])
    [pid] = gateways.pids()
    wait(lambda: _ignores_sigterm(pid), what="the gateway")
    started = time.monotonic()
    gateways.stop(timeout_s=1)
    # it gave the gateway its timeout, then killed it instead of waiting on (generous bound:
    # the point is that stop returns, not how fast on a loaded machine)
    assert 1 <= time.monotonic() - started < 30
    wait(lambda: not alive(pid), what="the kill", timeout_s=5)


def test_a_stranger_on_the_gateway_port_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        gateways = GatewayProcesses(tmp_path, [IDLE])
        with pytest.raises(InvalidArgument, match=f"127.0.0.1:{port} is in use"):
            gateways.adopt(host="127.0.0.1", port=port)
    assert gateways.pids() == []


def _runs_command(pid: int) -> bool:
    """The gated process passed its gate (it runs the command now)."""
    try:
        return b"time.sleep" in Path(f"/proc/{pid}/cmdline").read_bytes() and b"-I" not in (
            Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
    except OSError:
        return False


def _ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False
