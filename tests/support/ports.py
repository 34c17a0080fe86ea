"""Loopback ports for tests: the product's one `free_port` (`podium.ports`), under the name
every test and support module imports."""

from __future__ import annotations

from podium.ports import free_port

__all__ = ["free_port"]
