"""ConstraintBatch: every compiled slot in one pass, agreeing with the per-constraint path."""

from __future__ import annotations

import random

import numpy as np
import pytest

from podium.constraints import kernels
from podium.constraints.compile.base import FormConstraint, TableConstraint
from podium.constraints.compile.form import table_form
from podium.constraints.compile.table import DEAD, TokenTable
from podium.constraints.engine.batch import PYTHON, ConstraintBatch

EOS = (0,)
# 0 -a-> 1 -b-> 2 (accepting, no way on); 0 -c-> 3 (accepting, -a-> 2); 4: a dead end
TABLE = TokenTable.from_edges(5, [(0, 5, 1), (1, 6, 2), (0, 7, 3), (3, 5, 2)], [2, 3], 0, 10)


class GeneralTable(TableConstraint):
    """The same table, but seen by the batch as any constraint (the Python path)."""

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
    """One constraint instance for every row, each row at its given state."""
    batch = ConstraintBatch(eos)
    for slot, state in enumerate(states):
        batch.add_constraint(slot, constraint)
        batch.state[slot] = state
    return batch


def test_compiled_path_allows_what_the_python_path_allows() -> None:
    states = [0, 1, 2, 3, 4, DEAD]
    slots = np.arange(len(states))
    fast = _batch(TableConstraint(TABLE), states)
    general = _batch(GeneralTable(TABLE), states)
    assert fast.num_forms == 1 and (general.form[slots] == PYTHON).all()
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


def test_pairs_come_sorted_with_eos_merged_in() -> None:
    # sorted pairs let the mask skip its per-row sort
    batch = _batch(TableConstraint(TABLE), [0, 3, 2], eos=(6, 0))  # EOS ids given unsorted
    rows, tokens = batch.allowed(np.arange(3))
    assert list(zip(rows.tolist(), tokens.tolist(), strict=True)) == [
        (0, 5), (0, 7), (1, 0), (1, 5), (1, 6), (2, 0), (2, 6)]


def _random_table(rng: random.Random) -> TokenTable:
    """A random tree-shaped automaton over tokens 1..40 (0 is EOS)."""
    edges, n = [], 1
    for s in range(12):
        for t in rng.sample(range(1, 40), rng.randrange(0, 4)):
            edges.append((s, t, n))
            n += 1
    n = max(n, 12)
    return TokenTable.from_edges(n, edges, rng.sample(range(n), n // 3), 0, 41)


def test_many_specs_step_in_one_compiled_call_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 slots with 64 different constraints, mixed with a Python one: one advance and one
    allowed call per step for all compiled slots, each slot agreeing with itself alone."""
    rng = random.Random(3)
    tables = [_random_table(rng) for _ in range(64)]
    batch = ConstraintBatch(EOS)
    alone = []
    for slot, table in enumerate(tables):
        batch.add_constraint(slot, TableConstraint(table))
        single = ConstraintBatch(EOS)
        single.add_constraint(0, GeneralTable(table))  # the per-constraint Python path
        alone.append(single)
    batch.add_constraint(64, GeneralTable(tables[0]))
    assert batch.num_forms == 64
    calls = {"advance": 0, "allowed": 0}
    for name in calls:
        real = getattr(kernels, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(kernels, name, counted)
    slots = np.arange(65)
    for _step in range(6):
        rows, tokens = batch.allowed(slots)
        picks = []
        for i in range(65):
            options = sorted(tokens[rows == i].tolist())
            mine = alone[i if i < 64 else 0]
            _r0, t0 = mine.allowed(np.array([0]))
            if i < 64:
                assert options == sorted(t0.tolist()), f"slot {i} differs from its table alone"
            picks.append(rng.choice([*options, 39]))  # sometimes a token that kills the row
        batch._advance(slots, np.array(picks))
        for i in range(64):
            alone[i]._advance(np.array([0]), np.array([picks[i]]))
    assert calls == {"advance": 6, "allowed": 6}


def test_a_forms_last_request_frees_it_and_its_id_is_reused() -> None:
    a, b = TableConstraint(TABLE), TableConstraint(_random_table(random.Random(1)))
    batch = ConstraintBatch(EOS)
    batch.add_constraint(0, a)
    batch.add_constraint(1, a)
    assert batch.num_forms == 1  # one compiled form shared by both requests
    batch.remove(0)
    assert batch.num_forms == 1
    batch.remove(1)
    assert batch.num_forms == 0 and len(batch._lists["tokens"][0]) == 0
    batch.add_constraint(3, b)
    assert batch.form[3] == 0 and batch.num_forms == 1
    assert _pairs(batch, np.array([3])) == {(0, t) for t in
                                            b.table.tokens[: b.table.offsets[1]].tolist()} | (
        {(0, 0)} if b.table.accepting[0] or b.table.offsets[1] == 0 else set())


def test_peek_steps_copies_through_drafts_and_leaves_the_slots_as_they_were() -> None:
    batch = ConstraintBatch(EOS)
    batch.add_constraint(0, TableConstraint(TABLE))  # compiled
    batch.add_constraint(1, GeneralTable(TABLE))  # Python path: state it cannot copy
    before = (batch.state.copy(), batch.consumed.copy(), batch.active_slots().copy())
    parents = np.array([0, 0, 0, 0, 1])
    drafts = np.array([[5, 6], [7, 5], [7, 9], [5, 6], [5, 6]])  # 9: no edge, the walk dies
    depth = np.array([1, 2, 2, 0, 1])
    pairs = set(zip(*(a.tolist() for a in batch.peek(parents, drafts, depth)), strict=True))
    assert pairs == {(0, 6),  # after a: b
                     (1, 0),  # after c, a: state 2, accepting, nothing on: EOS
                     (2, 0),  # after c, 9: dead: EOS only
                     (3, 5), (3, 7),  # no drafts: the committed state's own tokens
                     (4, 0)}  # the Python path's draft row: EOS only (fail closed)
    # the held slots are untouched, no slot was taken for the drafts
    assert np.array_equal(batch.active_slots(), before[2])
    for now, was in zip((batch.state, batch.consumed), before[:2], strict=True):
        assert np.array_equal(now[: len(was)], was)
    assert _pairs(batch, np.array([0, 1])) == {(0, 5), (0, 7), (1, 5), (1, 7)}


def test_a_built_ins_own_methods_step_its_form_as_the_table_would() -> None:
    """A FormConstraint asked directly (one handle a slot, the batch kernels) against the
    plugin object path over the same table (the table's own numpy queries)."""
    rng = random.Random(3)
    table = _random_table(rng)
    form, plain = FormConstraint(table_form(table)), TableConstraint(table)
    handles = np.array([4, 0, 9])
    states = form.start(handles)
    assert states.tolist() == plain.start(handles).tolist() == [table.start] * 3
    for _step in range(8):
        rows, tokens = form.allowed(handles, states)
        prow, ptok = plain.allowed(handles, states)
        assert sorted(zip(rows.tolist(), tokens.tolist(), strict=True)) == sorted(
            zip(prow.tolist(), ptok.tolist(), strict=True))
        assert (form.is_accepting(handles, states) == plain.is_accepting(handles, states)).all()
        picks = np.array([rng.choice([*tokens[rows == i].tolist(), 1]) for i in range(3)])
        nxt = form.advance(handles, states, picks)
        assert nxt.tolist() == plain.advance(handles, states, picks).tolist()
        states = nxt
    lowered = form.lower(key="k", vocab_size=table.vocab_size, eos_token_ids=EOS)
    assert lowered.key == "k" and lowered.arrays["tokens"] is form.form.arrays["tokens"]
    assert GeneralTable(table).lower(key="k", vocab_size=10, eos_token_ids=EOS) is None
