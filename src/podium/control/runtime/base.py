"""What the control plane needs from a runtime, so the controller is testable without one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from podium.control.engine_signals import VersionSignals

STARTING, READY, DRAINING, STOPPED, FAILED = "starting", "ready", "draining", "stopped", "failed"


@dataclass(frozen=True)
class InstanceView:
    """A read-only snapshot of one instance."""

    id: str
    model: str
    version: str
    state: str
    url: str
    pid: int | None
    num_restarts: int
    log_path: str | None
    node: str = ""
    """The cluster node it runs on (a Ray node id); "" for this machine or not placed yet."""


class Runtime(Protocol):
    """Keeps the desired number of instances per model@version running and healthy."""

    def scale(self, model: str, version: str, count: int) -> None:
        """Start or drain instances until `count` of model@version are wanted."""

    def poll(self) -> None:
        """Check every instance once: readiness, crashes (restart), finished drains (stop)."""

    def instances(self, model: str | None = None,
                  version: str | None = None) -> list[InstanceView]:
        """Instances that are not stopped."""

    def engine_signals(self, model: str, version: str) -> VersionSignals:
        """vLLM's waiting requests and KV-cache usage on model@version's ready instances (the
        autoscaler asks only for deployments that declare engine targets)."""

    def num_crashes(self, model: str, version: str) -> int:
        """How many times instances of model@version exited without being asked to."""

    def close(self, timeout_s: float | None = None) -> None:
        """Drain and stop every instance; kill the ones left after `timeout_s`."""
