"""Per-slot constraint state of a whole batch, kept in arrays and stepped together.

The engine owns the token history; this class only remembers, per slot, how many output
tokens it has consumed and the last one. Each step it compares that with the history's
current length, so every case the engine produces falls out of one rule:

- one new token (decode): advance, vectorized over the slots of each distinct constraint;
- no new token (a chunk of prefill, or a step without this request): nothing to do;
- several new tokens (a request resumed with history, a late add): replay them, stepping all
  such slots together one token position at a time;
- fewer tokens than consumed, or a different last token (preemption, discarded tokens):
  reset the state machine and replay the history as it now is.

Python loops here run over distinct constraints and token positions, never over requests.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from podium.constraints import kernels
from podium.constraints.base import Constraint, TableConstraint
from podium.constraints.table import DEAD, TokenTable

FetchTokens = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``fetch(positions, indices)``: output token ``indices[i]`` of the i-th synced slot
(``positions`` index into the ``slots`` array given to ``sync``); -1 where not yet known."""

_NONE = -1


class _Released(Constraint):
    """Placeholder for a group whose requests have all left."""

    def start(self, handles: np.ndarray) -> np.ndarray:
        raise AssertionError("released constraint group used")

    advance = allowed = is_accepting = start  # type: ignore[assignment]


_RELEASED = _Released()


class ConstraintBatch:
    """Constraint state for up to ``capacity`` slots (batch rows or request slots)."""

    def __init__(self, eos_token_ids: tuple[int, ...], capacity: int = 8) -> None:
        self.eos = np.sort(np.asarray(eos_token_ids, dtype=np.int64))  # sorted: see table_allowed
        self._constraints: list[Constraint] = []  # group id -> constraint
        self._tables: list[TokenTable | None] = []  # group id -> its table, if a plain one
        self._group_of: dict[int, int] = {}  # id(constraint) -> group id
        self._free_handles: dict[int, list[int]] = {}  # group id -> recycled handles
        self._num_handles: dict[int, int] = {}
        self._active: np.ndarray | None = None  # active_slots(), until the batch changes
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        def grown(old: np.ndarray | None, fill: int) -> np.ndarray:
            new = np.full(capacity, fill, dtype=np.int64)
            if old is not None:
                new[: len(old)] = old
            return new

        g = getattr
        self._active = None
        self.group = grown(g(self, "group", None), _NONE)
        self.handle = grown(g(self, "handle", None), _NONE)
        self.state = grown(g(self, "state", None), DEAD)
        self.consumed = grown(g(self, "consumed", None), 0)
        self.last_token = grown(g(self, "last_token", None), _NONE)

    # --- batch makeup (called when the engine changes the batch, not every step) ---

    def add(self, slot: int, constraint: Constraint) -> None:
        """Put a new request in ``slot`` (replacing any occupant), at its start state."""
        if slot >= len(self.group):
            self._grow(max(slot + 1, 2 * len(self.group)))
        self.remove(slot)
        gid = self._group_of.get(id(constraint))
        if gid is None:
            gid = self._group_of[id(constraint)] = len(self._constraints)
            self._constraints.append(constraint)
            self._tables.append(_plain_table(constraint))
            self._free_handles[gid], self._num_handles[gid] = [], 0
        free = self._free_handles[gid]
        if free:
            h = free.pop()
        else:
            h = self._num_handles[gid]
            self._num_handles[gid] += 1
        self.group[slot], self.handle[slot] = gid, h
        self._active = None
        self._restart(np.array([slot]))

    def remove(self, slot: int) -> None:
        """Empty ``slot``; a no-op if it holds no constrained request."""
        if slot >= len(self.group) or self.group[slot] == _NONE:
            return
        gid, h = int(self.group[slot]), int(self.handle[slot])
        self._constraints[gid].release(np.array([h]))
        self._free_handles[gid].append(h)
        self.group[slot] = self.handle[slot] = _NONE
        self._active = None
        if len(self._free_handles[gid]) == self._num_handles[gid]:
            # last request of this constraint left: let the compiled constraint be freed
            self._group_of.pop(id(self._constraints[gid]), None)
            self._constraints[gid] = _RELEASED
            self._tables[gid] = None

    def move(self, src: int, dst: int) -> None:
        """One-way move: ``dst`` takes ``src``'s request (its occupant is dropped)."""
        if max(src, dst) >= len(self.group):
            self._grow(max(src, dst) + 1)
        self.remove(dst)
        for a in (self.group, self.handle, self.state, self.consumed, self.last_token):
            a[dst] = a[src]
        self.group[src] = self.handle[src] = _NONE
        self._active = None

    def swap(self, a: int, b: int) -> None:
        if max(a, b) >= len(self.group):
            self._grow(max(a, b) + 1)
        for arr in (self.group, self.handle, self.state, self.consumed, self.last_token):
            arr[[a, b]] = arr[[b, a]]
        self._active = None

    def active_slots(self) -> np.ndarray:
        """Slots holding a constrained request, ascending."""
        if self._active is None:
            self._active = np.flatnonzero(self.group != _NONE)
        return self._active

    # --- per step ---

    def sync(self, slots: np.ndarray, lengths: np.ndarray, fetch: FetchTokens) -> bool:
        """Bring the state of ``slots`` up to their histories' current ``lengths``; False when
        some history still holds a placeholder (-1) the engine has not filled in yet."""
        consumed = self.consumed[slots]
        # one read for the usual step: each slot's last consumed token (has the history been
        # rewritten?) and its first unconsumed one
        check = np.flatnonzero((lengths >= consumed) & (consumed > 0))
        pending = np.flatnonzero(lengths > consumed)
        tokens = fetch(np.concatenate((check, pending)),
                       np.concatenate((consumed[check] - 1, consumed[pending])))
        tail, tokens = tokens[: len(check)], tokens[len(check):]
        rewritten = lengths < consumed
        rewritten[check] |= (tail != self.last_token[slots[check]]) & (tail != -1)
        if rewritten.any():
            self._restart(slots[rewritten])
            consumed = self.consumed[slots]
            pending = np.flatnonzero(lengths > consumed)
            tokens = fetch(pending, consumed[pending])
        # replay every missing token; usually one pass with one token per slot
        complete = True
        while len(pending):
            known = tokens >= 0  # -1: a placeholder the engine has not filled in yet
            complete &= bool(known.all())
            pending, tokens = pending[known], tokens[known]
            pos = slots[pending]
            self._advance(pos, tokens)
            pending = pending[lengths[pending] > self.consumed[pos]]
            if len(pending):
                tokens = fetch(pending, self.consumed[slots[pending]])
        return complete

    def allowed(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Allowed ``(position into slots, token)`` pairs; EOS where the constraint may end,
        EOS alone where nothing else is allowed (complete, or left the language)."""
        groups = self.group[slots]
        by_group = _by_group(groups)
        if len(by_group) == 1 and by_group[0][0] != _NONE:
            t = self._tables[by_group[0][0]]
            if t is not None:  # the usual batch: one table constraint for every row
                return kernels.table_allowed(t.offsets, t.tokens, t.accepting,
                                             self.state[slots], self.eos)
        rows_parts, tok_parts = [], []
        need_eos = np.zeros(len(slots), dtype=bool)
        has_any = np.zeros(len(slots), dtype=bool)
        for gid, m in by_group:
            if gid == _NONE:
                continue
            c = self._constraints[gid]
            at = np.arange(len(slots)) if m is None else np.flatnonzero(m)
            s = self.state[slots[at]]
            h = self.handle[slots[at]]
            live = s != DEAD
            if not live.all():
                at, s, h = at[live], s[live], h[live]
            r, t = c.allowed(h, s)
            rows_parts.append(at[r])
            tok_parts.append(t)
            has_any[at[r]] = True
            need_eos[at] |= c.is_accepting(h, s)
        need_eos |= (groups != _NONE) & ~has_any
        eos_rows = np.flatnonzero(need_eos)
        if len(eos_rows):
            k = len(self.eos)
            rows_parts.append(np.repeat(eos_rows, k) if k > 1 else eos_rows)
            tok_parts.append(np.full(len(eos_rows), self.eos[0]) if k == 1
                             else np.tile(self.eos, len(eos_rows)))
        if not rows_parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(rows_parts), np.concatenate(tok_parts)

    def _restart(self, slots: np.ndarray) -> None:
        groups = self.group[slots]
        for gid in np.unique(groups):
            at = slots[groups == gid]
            self.state[at] = self._constraints[gid].start(self.handle[at])
        self.consumed[slots] = 0
        self.last_token[slots] = _NONE

    def _advance(self, slots: np.ndarray, tokens: np.ndarray) -> None:
        groups = self.group[slots]
        for gid, m in _by_group(groups):
            at = slots if m is None else slots[m]
            toks = tokens if m is None else tokens[m]
            s = self.state[at]
            t = self._tables[gid]
            if t is not None:  # one compiled call; a table steps DEAD rows to DEAD itself
                self.state[at] = kernels.step(t.offsets, t.tokens, t.targets, s, toks)
                continue
            live = s != DEAD
            if live.all():
                self.state[at] = self._constraints[gid].advance(self.handle[at], s, toks)
                continue
            nxt = np.full(len(at), DEAD, dtype=np.int64)
            if live.any():
                nxt[live] = self._constraints[gid].advance(self.handle[at][live], s[live],
                                                           toks[live])
            self.state[at] = nxt
        self.consumed[slots] += 1
        self.last_token[slots] = tokens


def _plain_table(constraint: Constraint) -> TokenTable | None:
    """The table of a constraint that is only a table (its methods are TableConstraint's own),
    which the batch can then step and query in one compiled call per step."""
    if not isinstance(constraint, TableConstraint):
        return None
    cls = type(constraint)
    own = (cls.advance, cls.allowed, cls.is_accepting)
    base = (TableConstraint.advance, TableConstraint.allowed, TableConstraint.is_accepting)
    return constraint.table if own == base else None


def _by_group(groups: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
    """``(group, mask)`` for each distinct group; mask None when every row is in it (the
    common batch: one constraint shared by all its requests)."""
    if len(groups) and groups[0] == groups.min() == groups.max():
        return [(int(groups[0]), None)]
    return [(int(g), groups == g) for g in np.unique(groups)]
