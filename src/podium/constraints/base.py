"""The constraint API: a state machine over generated tokens, stepped for many requests at once.

Built-ins and user-defined constraints implement :class:`Constraint`. One compiled instance is
shared by every request that asks for the same constraint; each request is a *handle* (a stable
small integer, unchanged when the engine moves the request inside its batch) with an integer
state that the batch processor stores. Every method takes arrays of handles and states, so the
processor calls each distinct constraint once per step, never once per request.

A constraint whose state is one integer (a token table) needs only :class:`TableConstraint`.
A constraint with more state per request (e.g. which items are already used) keeps it in its
own arrays indexed by handle, initialized in ``start`` and read in ``allowed``/``advance``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from podium.constraints.table import DEAD, TokenTable


class Constraint(ABC):
    """A compiled constraint: the allowed tokens of each state, and how tokens move states.

    End-of-sequence is not part of the token sets: the processor allows the model's EOS
    tokens wherever ``is_accepting`` is true, and only EOS when no token is allowed.
    """

    @abstractmethod
    def start(self, handles: np.ndarray) -> np.ndarray:
        """Reset per-request state of ``handles``; return their initial states (int64)."""

    @abstractmethod
    def advance(self, handles: np.ndarray, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """States after each request takes its token; ``DEAD`` (-1) when the token was not
        allowed. Called with each request's tokens in order, one token per request per call."""

    @abstractmethod
    def allowed(self, handles: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Allowed tokens, flattened: ``(position into handles, token id)`` pairs."""

    @abstractmethod
    def is_accepting(self, handles: np.ndarray, states: np.ndarray) -> np.ndarray:
        """Whether each request may end here (bool)."""

    def release(self, handles: np.ndarray) -> None:  # noqa: B027 - optional hook
        """The requests left the batch; drop any per-request state (optional)."""


class TableConstraint(Constraint):
    """A constraint whose whole state is one integer: a :class:`TokenTable`."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    def start(self, handles: np.ndarray) -> np.ndarray:
        return np.full(len(handles), self.table.start, dtype=np.int64)

    def advance(self, handles: np.ndarray, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.table.step(states, tokens)

    def allowed(self, handles: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.table.tokens_of(states)

    def is_accepting(self, handles: np.ndarray, states: np.ndarray) -> np.ndarray:
        return self.table.is_accepting(states)


__all__ = ["DEAD", "Constraint", "TableConstraint"]
