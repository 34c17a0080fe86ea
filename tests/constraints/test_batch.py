"""ConstraintBatch's one-call path for plain token tables agrees with the general path."""

from __future__ import annotations

import numpy as np

from podium.constraints.base import TableConstraint
from podium.constraints.batch import ConstraintBatch
from podium.constraints.table import DEAD, TokenTable

EOS = (0,)
# 0 -a-> 1 -b-> 2 (accepting, no way on); 0 -c-> 3 (accepting, -a-> 2); 4: a dead end
TABLE = TokenTable.from_edges(5, [(0, 5, 1), (1, 6, 2), (0, 7, 3), (3, 5, 2)], [2, 3], 0, 10)


class GeneralTable(TableConstraint):
    """The same table, but seen by the batch as any constraint (the general path)."""

    def allowed(self, handles: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return super().allowed(handles, states)


class NoFive(TableConstraint):
    """A table subclass that overrides allowed: the batch must not bypass it."""

    def allowed(self, handles: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, tokens = super().allowed(handles, states)
        return rows[tokens != 5], tokens[tokens != 5]


def _pairs(batch: ConstraintBatch, slots: np.ndarray) -> set[tuple[int, int]]:
    rows, tokens = batch.allowed(slots)
    return set(zip(rows.tolist(), tokens.tolist(), strict=True))


def _batch(constraint: TableConstraint, states: list[int],
           eos: tuple[int, ...] = EOS) -> ConstraintBatch:
    """One constraint instance for every row (one group), each row at its given state."""
    batch = ConstraintBatch(eos)
    for slot, state in enumerate(states):
        batch.add(slot, constraint)
        batch.state[slot] = state
    return batch


def test_plain_table_path_allows_what_the_general_path_allows() -> None:
    states = [0, 1, 2, 3, 4, DEAD]
    slots = np.arange(len(states))
    fast = _batch(TableConstraint(TABLE), states)
    general = _batch(GeneralTable(TABLE), states)
    assert _pairs(fast, slots) == _pairs(general, slots) == {
        (0, 5), (0, 7), (1, 6), (2, 0), (3, 5), (3, 0), (4, 0), (5, 0)}
    # stepping: the same states, DEAD where no edge (or already DEAD)
    tokens = np.array([7, 6, 5, 5, 5, 5])
    fast._advance(slots, tokens)
    general._advance(slots, tokens)
    assert fast.state.tolist()[:6] == general.state.tolist()[:6] == [3, 2, DEAD, 2, DEAD, DEAD]


def test_a_table_subclass_with_its_own_rules_is_not_bypassed() -> None:
    batch = _batch(NoFive(TABLE), [0])
    assert _pairs(batch, np.arange(1)) == {(0, 7)}


def test_plain_table_pairs_come_sorted_with_eos_merged_in() -> None:
    # sorted pairs let the mask skip its per-row sort
    batch = _batch(TableConstraint(TABLE), [0, 3, 2], eos=(6, 0))  # EOS ids given unsorted
    rows, tokens = batch.allowed(np.arange(3))
    assert list(zip(rows.tolist(), tokens.tolist(), strict=True)) == [
        (0, 5), (0, 7), (1, 0), (1, 5), (1, 6), (2, 0), (2, 6)]
