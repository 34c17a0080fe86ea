"""Loopback ports for tests: the one `free_port` every test and support module uses."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel considers free right now (another process may take it before it is
    bound: tests bind it at once)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]

