"""Which models an instance loads at start, and whether the repository API may change them:
Triton's `--model-control-mode`.

    podium    (Podium's default) load every model at start; load/unload over the API
    none      load every model at start; load/unload refused, in Triton's words
    explicit  load only the `--load-model` names at start (`*`: all); load/unload over the API
    poll      load every model at start, then follow the folder (`repository/poll.py`) every
              `--repository-poll-secs`; load/unload refused, in Triton's words
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from podium.errors import InvalidArgument

Mode = Literal["podium", "none", "explicit", "poll"]
ALL = "*"


@dataclass(frozen=True)
class ModelControl:
    """The instance's model control mode and its start-up models."""

    mode: Mode = "podium"
    load_models: tuple[str, ...] = ()
    """`--load-model` names (explicit mode only); `*` loads every model."""
    poll_secs: float | None = None
    """`--repository-poll-secs` (poll mode only; 15 s, Triton's default, when not given)."""

    def __post_init__(self) -> None:
        if self.poll_secs is not None and self.mode != "poll":
            raise InvalidArgument(f"--repository-poll-secs {self.poll_secs:g} needs "
                                  "--model-control-mode=poll", param="--repository-poll-secs")
        if self.load_models and self.mode != "explicit":
            raise InvalidArgument(
                f"--load-model {' '.join(self.load_models)} needs "
                f"--model-control-mode=explicit (with {self.mode}, every model loads at start)",
                param="--load-model")
        if ALL in self.load_models and len(self.load_models) > 1:
            raise InvalidArgument("--load-model '*' loads every model; give it alone",
                                  param="--load-model")

    def loads_at_start(self, name: str) -> bool:
        """Whether model `name` is loaded at start."""
        return self.mode != "explicit" or ALL in self.load_models or name in self.load_models

    @property
    def ready_when_empty(self) -> bool:
        """Explicit mode may serve no model yet (Triton's server is ready with none loaded)."""
        return self.mode == "explicit"

    def check_api(self, action: str, name: str) -> None:
        """Refuse a load/unload request where the mode forbids it (Triton's wording, which
        its clients match on)."""
        if self.mode in ("none", "poll"):
            raise InvalidArgument(
                f"explicit model load / unload is not allowed if polling is enabled: this "
                f"instance runs with --model-control-mode={self.mode}, so {action} of "
                f"{name!r} is refused (start it with --model-control-mode=explicit)",
                param="--model-control-mode")

    @property
    def poll_interval_s(self) -> float | None:
        """Seconds between polls of the repository; None when not polling."""
        return (15.0 if self.poll_secs is None else self.poll_secs) \
            if self.mode == "poll" else None
