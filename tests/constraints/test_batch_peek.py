"""ConstraintBatch.peek (speculative decoding's draft rows) in its one compiled pass: every row
equals a fresh replay of its parent's history plus its drafts, and the parents are left as
they were, ``distinct_items`` counts included."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from podium.constraints.compile.compiler import ConstraintCompiler
from podium.constraints.compile.vocab import TokenizerInfo
from podium.constraints.engine.batch import ConstraintBatch
from podium.constraints.spec.admission import validate_constraint
from tests.support.catalog import make_titles
from tests.support.walk import Walker

SPECS = [
    {"type": "distinct_items", "items": make_titles(30), "min": 1, "max": 3},
    {"type": "distinct_items", "items": ["a", "ab", "b", "abc"], "min": 2, "max": 4},
    {"type": "choice", "choices": make_titles(50)},
]


def _fresh(constraint: object, eos: tuple[int, ...], history: list[int]) -> set[int]:
    return _replay(constraint, eos, history)[0]


def _replay(constraint: object, eos: tuple[int, ...], history: list[int]) -> tuple[set[int], int]:
    """A fresh batch's allowed tokens after ``history``, and the items it has completed."""
    w = Walker(constraint, eos)  # type: ignore[arg-type]
    w.history = list(history)
    return w.allowed(), int(w.batch.count[0])


def _valid_walk(constraint: object, eos: tuple[int, ...], rng: random.Random) -> list[int]:
    w = Walker(constraint, eos)  # type: ignore[arg-type]
    options = [t for t in sorted(w.allowed()) if t not in eos]
    while options and len(w.history) < 40:
        w.history.append(rng.choice(options))
        options = [t for t in sorted(w.allowed()) if t not in eos]
    return w.history


@pytest.mark.parametrize("layout", ["scattered", "runner"])
def test_every_draft_row_equals_a_fresh_replay_and_the_parents_are_untouched(
        tok: TokenizerInfo, layout: str) -> None:
    """``runner``: a parent's rows together by depth, as the V2 runner lays them out, so the
    kernel's chains (a row going on from the row before) run, broken where a row's drafts
    differ; ``scattered``: every row from its parent."""
    rng = random.Random(7)
    eos = tok.eos_token_ids
    compiler = ConstraintCompiler(tok)
    constraints = [compiler.compile(validate_constraint(s)) for s in SPECS]
    batch = ConstraintBatch(eos)
    slots: list[tuple[int, object, list[int], list[int]]] = []  # slot, constraint, history, walk
    for slot in range(9):
        c = constraints[slot % len(constraints)]
        walk = _valid_walk(c, eos, rng)
        cut = 0 if slot < 3 else rng.randrange(len(walk))  # three parents at the very start
        history = walk[:cut]
        batch.add_constraint(slot, c)  # type: ignore[arg-type]
        batch.sync(np.array([slot]), np.array([cut]),
                   lambda _p, i, h=history: np.array([h[int(j)] for j in i]))
        slots.append((slot, c, history, walk[cut:]))
    before = [a.copy() for a in (batch.state, batch.count, batch.consumed, batch.last_token)]
    alive_before = [batch._alive[s].copy() for s, *_ in slots]

    parents, drafts, depth, want = [], [], [], []
    completed = 0  # rows whose drafts complete an item: the parent's counts are borrowed
    for slot, c, history, rest in slots:
        for _row in range(8):  # several rows per parent, items completed along the way
            d = rng.randrange(5)
            row = list(rest[:d])
            if row and rng.random() < 0.2:
                row[rng.randrange(len(row))] = rng.randrange(3, 3000)  # a rejected draft
            parents.append(slot)
            drafts.append(row + [-1] * (4 - len(row)))
            depth.append(len(row))
            allowed, used = _replay(c, eos, history + row)
            want.append(allowed)
            completed += used > _replay(c, eos, history)[1]
    order = rng.sample(range(len(parents)), len(parents))  # rows of a parent not together
    if layout == "runner":
        order.sort(key=lambda j: (parents[j], depth[j]))
        extended = sum(parents[a] == parents[b] and 0 < depth[a] < depth[b]
                       and drafts[a][:depth[a]] == drafts[b][:depth[a]]
                       for a, b in itertools.pairwise(order))
        assert extended >= 6, extended  # the chains really ran
    p, d, k = (np.array([x[i] for i in order]) for x in (parents, drafts, depth))
    rows, tokens = batch.peek(p, d, k)
    got: list[set[int]] = [set() for _ in order]
    for r, t in zip(rows.tolist(), tokens.tolist(), strict=True):
        got[r].add(t)
    for i, j in enumerate(order):
        assert got[i] == want[j], (parents[j], drafts[j][:depth[j]])
    assert completed >= 5, completed
    for now, was in zip((batch.state, batch.count, batch.consumed, batch.last_token), before,
                        strict=True):
        assert np.array_equal(now, was)
    for (s, *_), was in zip(slots, alive_before, strict=True):
        assert np.array_equal(batch._alive[s], was)


def test_a_row_whose_drafts_open_more_tokens_than_its_parent_outgrows_the_first_guess(
        tok: TokenizerInfo) -> None:
    """The kernel sizes its output by the parents' states; a draft from the start (one or two
    tokens allowed) into a list's first item (dozens) must grow it, not overrun it."""
    eos = tok.eos_token_ids
    letters = [chr(65 + i) + "x" for i in range(26)] + [chr(97 + i) + "y" for i in range(26)]
    spec = {"type": "distinct_items", "items": letters, "min": 1, "max": 2}
    c = ConstraintCompiler(tok).compile(validate_constraint(spec))
    batch = ConstraintBatch(eos)
    batch.add_constraint(0, c)
    chain: list[int] = []  # from the start along the narrow prefix (`[`, a quote) ...
    while len(options := sorted(_fresh(c, eos, chain) - set(eos))) <= 2 and len(chain) < 4:
        chain.append(options[0])
    want = _fresh(c, eos, chain)  # ... into the first item's many first tokens
    assert chain and len(want) > 16 + 2 * len(eos), "the spec must open a wide state"
    drafts = np.array([chain, chain])
    rows, tokens = batch.peek(np.array([0, 0]), drafts, np.array([len(chain)] * 2))
    assert set(tokens[rows == 0].tolist()) == set(tokens[rows == 1].tolist()) == want
    assert np.all(np.diff(tokens[rows == 0]) > 0)  # ascending within a row, as allowed's
