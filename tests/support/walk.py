"""Driving one compiled constraint token by token, as a single request would."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from podium.constraints.compile.base import Constraint
from podium.constraints.engine.batch import ConstraintBatch


class Walker:
    """One request's view of a constraint: its allowed set now, and taking a token."""

    def __init__(self, constraint: Constraint, eos: tuple[int, ...]) -> None:
        self.batch = ConstraintBatch(eos)
        self.batch.add_constraint(0, constraint)
        self.history: list[int] = []
        self.eos = set(eos)

    def allowed(self) -> set[int]:
        slots = np.array([0])
        self.batch.sync(slots, np.array([len(self.history)]),
                        lambda _p, i: np.array([self.history[int(j)] for j in i]))
        _rows, tokens = self.batch.allowed(slots)
        return set(tokens.tolist())

    def take(self, token: int) -> None:
        assert token in self.allowed(), f"token {token} not allowed"
        self.history.append(token)

    def accepts(self, tokens: list[int]) -> bool:
        """Whether the constraint lets exactly ``tokens`` through and then allows EOS."""
        for t in tokens:
            if t not in self.allowed():
                return False
            self.history.append(t)
        return bool(self.allowed() & self.eos)

    def sample(self, pick: Callable[[list[int]], int], max_tokens: int = 200) -> list[int]:
        """Generate until EOS is picked; ``pick`` chooses among the sorted allowed tokens."""
        for _ in range(max_tokens):
            options = sorted(self.allowed())
            t = pick(options)
            if t in self.eos:
                return self.history
            self.history.append(t)
        raise AssertionError(f"no EOS after {max_tokens} tokens")
