"""Free loopback ports: the one `free_port`, used by the local runtime (each instance's ports),
the tests (`tests/support/ports.py`) and the benchmarks (`bench/harness`)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel considers free right now (another process may take it before it is
    bound: bind it at once)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
