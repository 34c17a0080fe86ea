"""Token tables: a state machine over token ids compiled to sorted arrays.

A table holds, for every state, the sorted tokens that leave it and where each one goes
(compressed sparse rows). A constraint compiles to one (``choice``, ``regex``; ``distinct_items``
adds guards) and is then stepped as its compiled form (:mod:`podium.constraints.compile.form`) by
the batch kernels. The table's own queries serve its compile and a plugin's object path
(:class:`~podium.constraints.compile.base.TableConstraint` subclasses): ``step`` is the kernels'
edge search (:func:`podium.constraints.kernels.edge_index`), ``tokens_of`` one ragged gather.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from podium.constraints import kernels

DEAD = -1
"""State of a row whose history left the language (e.g. another processor forced a token)."""


@dataclass(frozen=True, eq=False)
class TokenTable:
    """A deterministic automaton over token ids, in CSR form."""

    offsets: np.ndarray
    """int64 [num_states + 1]: edges of state s are ``offsets[s]:offsets[s+1]``."""
    tokens: np.ndarray
    """int64 [num_edges]: token of each edge, sorted within a state."""
    targets: np.ndarray
    """int64 [num_edges]: state reached by each edge."""
    accepting: np.ndarray
    """bool [num_states]: whether end-of-sequence is allowed in the state."""
    start: int
    """Initial state."""
    vocab_size: int
    """Width of the logits this table masks; every token is below it."""

    @property
    def num_states(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_edges(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_edges(
        cls,
        num_states: int,
        edges: Iterable[tuple[int, int, int]] | np.ndarray,
        accepting: Iterable[int],
        start: int,
        vocab_size: int,
    ) -> TokenTable:
        """Build a table from ``(state, token, target)`` triples in any order."""
        arr = np.asarray(list(edges) if not isinstance(edges, np.ndarray) else edges,
                         dtype=np.int64).reshape(-1, 3)
        if len(arr) and (arr[:, 1].min() < 0 or arr[:, 1].max() >= vocab_size):
            raise ValueError(f"edge token outside the vocabulary of {vocab_size}")
        # one int64 key per edge (state, token) sorts twice as fast as a two-key lexsort
        pair = arr[:, 0] * vocab_size + arr[:, 1]
        order = np.argsort(pair, kind="stable")
        arr, pair = arr[order], pair[order]
        if len(arr) > 1:
            dup = pair[1:] == pair[:-1]
            if dup.any():
                i = int(np.argmax(dup))
                raise ValueError(f"state {arr[i, 0]} has two edges on token {arr[i, 1]}")
        counts = np.bincount(arr[:, 0], minlength=num_states)
        offsets = np.zeros(num_states + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        acc = np.zeros(num_states, dtype=bool)
        acc[np.asarray(accepting if isinstance(accepting, np.ndarray) else list(accepting),
                       dtype=np.int64)] = True
        return cls(offsets, arr[:, 1].copy(), arr[:, 2].copy(), acc, start, vocab_size)

    def edge_index(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Index of the edge each (state, token) pair takes, or -1 where none leaves."""
        return kernels.edge_index(self.offsets, self.tokens, as_i64(states), as_i64(tokens))

    def step(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The state each row reaches after its token; ``DEAD`` where the token has no edge."""
        edges = self.edge_index(states, tokens)
        out = np.full(len(edges), DEAD, dtype=np.int64)
        hit = edges >= 0
        out[hit] = self.targets[edges[hit]]
        return out

    def walk(self, tokens: Iterable[int], state: int | None = None) -> int:
        """The state reached after a whole token sequence (``DEAD`` once it leaves)."""
        s = self.start if state is None else state
        for t in tokens:
            if s == DEAD:
                break
            s = int(self.step(np.array([s]), np.array([t]))[0])
        return s

    def tokens_of(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens each row may take now, flattened: ``(row_position, token)``, each row's
        tokens ascending."""
        states = as_i64(states)
        rows = np.flatnonzero(states != DEAD)
        lo = self.offsets[states[rows]]
        counts = self.offsets[states[rows] + 1] - lo
        # edge k of row r is lo[r] + k: the flat positions, less each row's start, plus lo
        starts = np.cumsum(counts) - counts
        edges = np.arange(int(counts.sum())) + np.repeat(lo - starts, counts)
        return np.repeat(rows, counts), self.tokens[edges].astype(np.int64)

    def is_accepting(self, states: np.ndarray) -> np.ndarray:
        states = as_i64(states)
        out = np.zeros(len(states), dtype=bool)
        live = states != DEAD
        out[live] = self.accepting[states[live]]
        return out


def as_i64(a: np.ndarray) -> np.ndarray:
    """``a`` as the contiguous int64 array the compiled kernels take (no copy if it is one)."""
    return np.ascontiguousarray(a, dtype=np.int64)
