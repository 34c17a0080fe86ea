"""The model repository of one instance: loaded backends by name and version.

Requests take a lease on a backend (`async with repository.lease(name, version)`); unloading
removes the backend from routing first and waits for its leases to end, so in-flight requests
finish on the version they started on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from podium.backends import create_backend
from podium.backends.base import Backend
from podium.errors import Conflict, NotFound, Unavailable
from podium.package.package import Package


@dataclass
class ModelEntry:
    """A backend plus its serving state in this instance."""

    backend: Backend
    state: str = "LOADING"  # LOADING → READY → UNLOADING → UNAVAILABLE
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    loaded_at: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        self.idle.set()


class ModelRepository:
    """Loaded models of one instance; the only place that loads and unloads backends."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, ModelEntry]] = {}
        self.packages: dict[str, Package] = {}
        """Packages known to this instance by name@version (loaded or not)."""

    # -- queries -----------------------------------------------------------------------------
    def entries(self) -> list[ModelEntry]:
        return [e for versions in self._entries.values() for e in versions.values()]

    def ready_entries(self) -> list[ModelEntry]:
        return [e for e in self.entries() if e.state == "READY"]

    def all_ready(self) -> bool:
        entries = self.entries()
        return bool(entries) and all(e.state == "READY" for e in entries)

    def find(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry for name@version; without a version, the latest READY one."""
        versions = self._entries.get(name)
        if not versions:
            known = ", ".join(sorted(self._entries)) or "none"
            raise NotFound(f"model {name!r} is not served here (models: {known})", param="model")
        if version is not None:
            entry = versions.get(version)
            if entry is None:
                raise NotFound(f"model {name!r} has no version {version!r} (versions: "
                               f"{', '.join(sorted(versions, key=_version_key))})", param="model")
            return entry
        ready = [v for v, e in versions.items() if e.state == "READY"]
        if not ready:
            raise Unavailable(f"model {name!r} has no ready version yet")
        return versions[max(ready, key=_version_key)]

    def get(self, name: str, version: str | None = None) -> Backend:
        return self.find(name, version).backend

    @asynccontextmanager
    async def lease(self, name: str, version: str | None = None) -> AsyncIterator[Backend]:
        """Use a READY backend for the span of one request."""
        entry = self.find(name, version)
        if entry.state != "READY":
            raise Unavailable(f"model {name!r} version {entry.backend.version} is "
                              f"{entry.state.lower()}, not ready")
        entry.in_flight += 1
        entry.idle.clear()
        try:
            yield entry.backend
        finally:
            entry.in_flight -= 1
            if entry.in_flight == 0:
                entry.idle.set()

    # -- changes -----------------------------------------------------------------------------
    async def load(self, package: Package) -> ModelEntry:
        """Create and load the package's backend; it serves once loaded."""
        name, version = package.manifest.name, package.manifest.version
        existing = self._entries.get(name, {}).get(version)
        if existing is not None and existing.state in ("LOADING", "READY"):
            raise Conflict(f"model {name!r} version {version!r} is already "
                           f"{existing.state.lower()}")
        entry = ModelEntry(create_backend(package))
        self._entries.setdefault(name, {})[version] = entry
        self.packages[package.key] = package
        try:
            await entry.backend.load()
        except BaseException as exc:
            entry.state, entry.reason = "UNAVAILABLE", str(exc)
            raise
        entry.state, entry.loaded_at = "READY", time.time()
        return entry

    async def unload(self, name: str, version: str | None = None,
                     timeout_s: float | None = None) -> list[ModelEntry]:
        """Stop routing to the model (one version or all), let in-flight requests finish,
        then release it."""
        versions = self._entries.get(name)
        if not versions:
            raise NotFound(f"model {name!r} is not loaded", param="model")
        targets = [self.find(name, version)] if version is not None else list(versions.values())
        for entry in targets:
            entry.state = "UNLOADING"
        for entry in targets:
            try:
                await asyncio.wait_for(entry.idle.wait(), timeout_s)
            except TimeoutError:
                pass  # the deadline wins over stragglers; their requests fail with 503
            await entry.backend.unload()
            entry.state = "UNAVAILABLE"
            versions.pop(entry.backend.version, None)
        if not versions:
            self._entries.pop(name, None)
        return targets

    async def unload_all(self, timeout_s: float | None = None) -> None:
        for name in list(self._entries):
            await self.unload(name, timeout_s=timeout_s)


def _version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)
