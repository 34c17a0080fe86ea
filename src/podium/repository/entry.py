"""One served model version: its backend and its serving state in this instance."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from podium.backends.base import Backend
from podium.repository.stats import ModelStats

LOADING, READY, UNLOADING, UNAVAILABLE = "LOADING", "READY", "UNLOADING", "UNAVAILABLE"
"""Triton's model states: LOADING → READY → UNLOADING → UNAVAILABLE (also: failed or dead)."""


@dataclass
class ModelEntry:
    """A backend plus its serving state; a lease on it is what a request holds."""

    backend: Backend
    state: str = LOADING
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    loaded_at: float = 0.0
    """Wall-clock time (epoch seconds) the version became ready."""
    reason: str = ""
    """Why the entry is not ready (e.g. its engine died), for the repository index."""
    stats: ModelStats = field(default_factory=ModelStats)
    parent: ModelEntry | None = None
    """For a LoRA adapter: the base model's entry, whose engine serves it (a lease on the
    adapter holds the base, so the base drains its adapters' requests too)."""

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def version(self) -> str:
        """The resolved version: the one that serves requests leased on this entry."""
        return self.backend.version

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def ready(self) -> bool:
        return self.state == READY and (self.parent is None or self.parent.ready)

    def acquire(self) -> None:
        self.in_flight += 1
        self.idle.clear()
        if self.parent is not None:
            self.parent.acquire()

    def release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()
        if self.parent is not None:
            self.parent.release()
