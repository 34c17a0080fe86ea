"""A runtime whose instances are ready the moment they are asked for (control-loop tests)."""

from __future__ import annotations

from podium.control.runtime.base import READY, InstanceView


class FakeRuntime:
    """Instances are ready the moment they are asked for."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def scale(self, model: str, version: str, count: int) -> None:
        self.counts[(model, version)] = count

    def poll(self) -> None:
        pass

    def instances(self, model: str | None = None,
                  version: str | None = None) -> list[InstanceView]:
        return [InstanceView(f"{m}-{v}-{n}", m, v, READY, "http://x", None, 0, None)
                for (m, v), count in self.counts.items() for n in range(count)
                if model in (None, m) and version in (None, v)]

    def num_crashes(self, model: str, version: str) -> int:
        return 0

    def close(self) -> None:
        pass
