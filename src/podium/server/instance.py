"""The live state of one instance: its repository, readiness and boot record."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from podium.boot_timeline import SubStep
from podium.repository import ModelEntry, ModelRepository
from podium.server.config import ServerConfig

log = logging.getLogger("podium.instance")


@dataclass
class BootStep:
    name: str
    seconds: float
    detail: str = ""
    steps: list[SubStep] = field(default_factory=list)
    """Its parts, timed inside it (`podium.boot_timeline`): a vLLM engine's start."""


@dataclass
class Instance:
    """Everything the frontends and the boot sequence share."""

    config: ServerConfig
    repository: ModelRepository = field(default_factory=ModelRepository)
    booted: bool = False
    draining: bool = False
    boot_error: str | None = None
    boot_steps: list[BootStep] = field(default_factory=list)
    boot_task: asyncio.Task | None = None
    stop: Callable[[], None] | None = None
    """Ends the serving process (set by `podium.server.serve`); a dead engine calls it."""
    open_ports: Callable[[], Awaitable[None]] | None = None
    """Opens the ports that serve only a ready instance (gRPC): boot's last step."""
    frontends: str | None = "embedded"
    """embedded or standalone (`server.frontends`); None until boot has read the packages."""
    mount_frontends: Callable[[str], Awaitable[None]] | None = None
    """Mounts the mode's routes once boot knows it (set by `build_app`)."""

    def __post_init__(self) -> None:
        # a load over the API rescans --repository, finding packages added after boot
        self.repository.root = self.config.repository
        self.repository.on_dead = self._engine_died
        self.repository.limits = self.config.instance_limits()
        self.repository.control = self.config.model_control()

    def is_ready(self) -> bool:
        """Ready: booted, not draining, and every model loaded."""
        return self.booted and not self.draining and self.repository.all_ready()

    def status(self) -> str:
        if self.boot_error:
            return "failed"
        if self.draining:
            return "draining"
        return "ready" if self.is_ready() else "starting"

    def _engine_died(self, entry: ModelEntry) -> None:
        """A dead engine never comes back: stop (exit 1) so a supervisor starts a fresh
        instance, instead of answering 500 to everything while looking alive."""
        if self.draining:
            return  # already stopping
        from podium.metrics.server import set_ready

        self.boot_error = f"engine died: {entry.key}"
        set_ready(False)
        log.error("the engine of %s died; stopping so the instance is restarted", entry.key)
        if self.stop is not None:
            self.stop()
