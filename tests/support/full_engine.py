"""A stand-in for vLLM's engine whose admission check refuses while it is full."""

from __future__ import annotations

from vllm.exceptions import QueueOverflowError


class FullEngine:
    """vLLM's admission check, refusing while `full`; counts its checks."""

    def __init__(self) -> None:
        self.full = True
        self.checks = 0

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        self.checks += 1
        if self.full:
            raise QueueOverflowError()
