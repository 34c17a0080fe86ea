"""`podium top` driven like a user would: under a pseudo-terminal, against a fake instance."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from tests.support.fake_metrics import fake_instance

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


def spawn_in_pty(*args: str) -> tuple[subprocess.Popen, int, int]:
    master, slave = pty.openpty()
    # A wide terminal so every column fits, as on an operator's screen.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "PODIUM_API_KEY": ""}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "podium.top", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
        # Its own session with the pty as controlling terminal, so Ctrl-C becomes SIGINT.
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    return proc, master, slave


def read_until(master: int, pattern: re.Pattern[str], timeout: float = 20) -> str:
    """Read the terminal until `pattern` matches the ANSI-stripped output."""
    raw = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                raw += os.read(master, 65536)
            except OSError:
                break
            text = ANSI.sub("", raw.decode("utf-8", "replace"))
            if pattern.search(text):
                return text
    raise AssertionError(f"never saw {pattern.pattern!r}; screen:\n{ANSI.sub('', raw.decode())}")


def wait_exit(proc: subprocess.Popen, master: int, timeout: float = 10) -> int:
    """Wait for exit while draining the terminal, as a real one does (a full pty blocks writes)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            with contextlib.suppress(OSError):  # the child closed its end
                os.read(master, 65536)
    return proc.wait(timeout=1)


def cells(screen: str, name: str) -> list[str]:
    """The cells of the last table line starting with `name`."""
    line = [ln for ln in screen.splitlines() if ln.strip("│┃ ").startswith(name)][-1]
    return [c.strip() for c in re.split(r"[│┃]", line) if c.strip()]


def number(cell: str) -> float:
    return float(re.match(r"[\d.]+", cell).group())  # type: ignore[union-attr]


def test_live_view_shows_rates_latency_and_queues_then_quits_on_q() -> None:
    with fake_instance(api_key="sekret") as url:
        proc, master, slave = spawn_in_pty(url, "--interval", "0.5", "--api-key", "sekret")
        try:
            # The first screen has only gauges; rates appear from the second scrape on.
            screen = read_until(master, re.compile(r"127\.0\.0\.1.*\d+ ms"))
            assert "q to quit" in screen
            row = cells(screen, url)
            ready, rps, gen, prompt, p50, p99, kv, running, waiting = row[1:]
            assert ready == "yes"
            assert number(rps) == pytest.approx(4, rel=0.25)
            assert number(gen) == pytest.approx(100, rel=0.25)
            assert number(prompt) == pytest.approx(250, rel=0.25)
            assert (p50, p99) == ("78 ms", "380 ms")
            assert (kv, running, waiting) == ("42.0%", "3", "1")
            os.write(master, b"q")
            assert wait_exit(proc, master) == 0
            # The terminal is handed back in its normal (canonical, echoing) mode.
            assert termios.tcgetattr(slave)[3] & termios.ICANON
        finally:
            proc.kill()
            os.close(master)
            os.close(slave)


def test_several_instances_with_one_down_and_a_total() -> None:
    with fake_instance() as one, fake_instance() as two:
        proc, master, slave = spawn_in_pty(one, two, "http://127.0.0.1:9/", "--interval", "0.5")
        try:
            screen = read_until(master, re.compile(r"total.*\d+ ms"))
            assert cells(screen, "http://127.0.0.1:9")[1] == "down"
            total = cells(screen, "total")
            assert number(total[3]) == pytest.approx(200, rel=0.25)
            assert total[-2:] == ["6", "2"]
            os.write(master, b"\x03")  # Ctrl-C also leaves cleanly
            assert wait_exit(proc, master) == 0
        finally:
            proc.kill()
            os.close(master)
            os.close(slave)


def test_once_prints_one_table_without_a_terminal() -> None:
    with fake_instance(api_key="k") as url:
        env = {**os.environ, "PODIUM_API_KEY": "k", "COLUMNS": "200"}
        out = subprocess.run(
            [sys.executable, "-m", "podium.top", url, "--once", "--interval", "0.3"],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        row = cells(out.stdout, url)
        assert row[5:7] == ["78 ms", "380 ms"]
        assert out.stdout.count("podium top") == 1


def test_missing_key_is_reported_with_the_fix() -> None:
    with fake_instance(api_key="k") as url:
        env = {**os.environ, "PODIUM_API_KEY": "", "COLUMNS": "200"}
        out = subprocess.run(
            [sys.executable, "-m", "podium.top", url, "--once", "--interval", "0.1"],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert "down" in out.stdout
        assert "HTTP 401 (pass --api-key or set PODIUM_API_KEY)" in out.stdout
