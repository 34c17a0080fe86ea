"""Token tables: a state machine over token ids compiled to sorted arrays.

A table holds, for every state, the sorted tokens that leave it and where each one goes
(compressed sparse rows). Both questions the decoding loop asks are vectorized over a batch:
``step`` (where does each row go after its sampled token) is one ``searchsorted`` on a global
key ``state * vocab + token``, which is sorted because edges are sorted by (state, token);
``edges_of`` (which tokens may each row take now) is one ragged gather.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

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

    def __post_init__(self) -> None:
        keys = (np.repeat(np.arange(self.num_states), np.diff(self.offsets)) * self.vocab_size
                + self.tokens)
        object.__setattr__(self, "_keys", keys)

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
        order = np.lexsort((arr[:, 1], arr[:, 0]))
        arr = arr[order]
        if len(arr) > 1:
            dup = (arr[1:, 0] == arr[:-1, 0]) & (arr[1:, 1] == arr[:-1, 1])
            if dup.any():
                i = int(np.argmax(dup))
                raise ValueError(f"state {arr[i, 0]} has two edges on token {arr[i, 1]}")
        counts = np.bincount(arr[:, 0], minlength=num_states)
        offsets = np.zeros(num_states + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        acc = np.zeros(num_states, dtype=bool)
        acc[list(accepting)] = True
        return cls(offsets, arr[:, 1].copy(), arr[:, 2].copy(), acc, start, vocab_size)

    def edge_index(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Index of the edge each (state, token) pair takes, or -1 where none leaves."""
        live = states >= 0
        s = np.where(live, states, 0)
        starts = self.offsets[s]
        counts = np.where(live, self.offsets[s + 1] - starts, 0)
        if counts.sum() <= 64 * len(states):
            # few edges per row (deep in a trie): scanning each row's contiguous slice beats a
            # binary search over every key, whose probes miss the cache after a forward pass
            rows, idx = ragged_ranges(starts, counts)
            hit = self.tokens[idx] == tokens[rows]
            out = np.full(len(states), -1, dtype=np.int64)
            out[rows[hit]] = idx[hit]
            return out
        keys: np.ndarray = self._keys  # type: ignore[attr-defined]
        if len(keys) == 0:
            return np.full(len(states), -1, dtype=np.int64)
        q = states * self.vocab_size + tokens
        idx = np.searchsorted(keys, q)
        idx_c = np.minimum(idx, len(keys) - 1)
        ok = (keys[idx_c] == q) & (states >= 0) & (tokens >= 0)
        return np.where(ok, idx_c, -1)

    def step(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The state each row reaches after its token; ``DEAD`` where the token has no edge."""
        e = self.edge_index(states, tokens)
        return np.where(e >= 0, self.targets[np.maximum(e, 0)], DEAD)

    def walk(self, tokens: Iterable[int], state: int | None = None) -> int:
        """The state reached after a whole token sequence (``DEAD`` once it leaves)."""
        s = self.start if state is None else state
        for t in tokens:
            if s == DEAD:
                break
            s = int(self.step(np.array([s]), np.array([t]))[0])
        return s

    def edges_of(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All edges leaving each row's state, flattened: ``(row_position, edge_index)``."""
        live = states >= 0
        s = np.where(live, states, 0)
        starts = self.offsets[s]
        counts = np.where(live, self.offsets[s + 1] - starts, 0)
        return ragged_ranges(starts, counts)

    def is_accepting(self, states: np.ndarray) -> np.ndarray:
        return np.where(states >= 0, self.accepting[np.maximum(states, 0)], False)


def ragged_ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``range(starts[i], starts[i] + counts[i])``; also return each item's i."""
    total = int(counts.sum())
    rows = np.repeat(np.arange(len(counts)), counts)
    if total == 0:
        return rows, np.zeros(0, dtype=np.int64)
    # position inside the concatenation minus where each row's block begins, plus its start
    block_begin = np.cumsum(counts) - counts
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - block_begin, counts)
    return rows, idx
