"""The live state of one instance: its repository, readiness and boot record."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from podium.server.config import ServerConfig
from podium.server.repository import ModelRepository


@dataclass
class BootStep:
    name: str
    seconds: float
    detail: str = ""


@dataclass
class Instance:
    """Everything the frontends and the boot sequence share."""

    config: ServerConfig
    repository: ModelRepository = field(default_factory=ModelRepository)

    def __post_init__(self) -> None:
        # a load over the API rescans --repository, finding packages added after boot
        self.repository.root = self.config.repository
    booted: bool = False
    draining: bool = False
    boot_error: str | None = None
    boot_steps: list[BootStep] = field(default_factory=list)
    boot_task: asyncio.Task | None = None

    def is_ready(self) -> bool:
        """Ready: booted, not draining, and every model loaded."""
        return self.booted and not self.draining and self.repository.all_ready()

    def status(self) -> str:
        if self.boot_error:
            return "failed"
        if self.draining:
            return "draining"
        return "ready" if self.is_ready() else "starting"
