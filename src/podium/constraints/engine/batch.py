"""Per-slot constraint state of a whole batch, kept in arrays and stepped in one pass.

The engine owns the token history; this class only remembers, per slot, its compiled form, how
many output tokens it has consumed and the last one. Each step it compares that with the
history's current length, so every case the engine produces falls out of one rule:

- one new token (decode): advance;
- no new token (a chunk of prefill, or a step without this request): nothing to do;
- several new tokens (a request resumed with history, a late add): replay them, stepping all
  such slots together one token position at a time;
- fewer tokens than consumed, or a different last token (preemption, discarded tokens):
  reset the state machine and replay the history as it now is.

Every slot with a compiled form (:mod:`podium.constraints.compile.form`: ``choice``, ``regex``,
``distinct_items``, plain-table plugins) is advanced and queried by one compiled call per step
for the whole batch (:mod:`podium.constraints.kernels`), however many distinct specs it
holds. Only plugin constraints with their own Python state are called per distinct constraint.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable

import numpy as np
from numba import typed, types

from podium.constraints import kernels as bk
from podium.constraints.compile.base import Constraint
from podium.constraints.compile.form import DISTINCT, FIELDS, CompiledForm
from podium.constraints.compile.table import DEAD

FetchTokens = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``fetch(positions, indices)``: output token ``indices[i]`` of the i-th synced slot
(``positions`` index into the ``slots`` array given to ``sync``); -1 where not yet known."""

EMPTY, PYTHON = -1, -2
"""``form`` of a slot holding no constrained request; of one held by a Python constraint."""

_NO_ALIVE = np.zeros(0, dtype=np.int32)


_LOWERED: weakref.WeakKeyDictionary[Constraint, CompiledForm | None] = \
    weakref.WeakKeyDictionary()


def _lowered(constraint: Constraint, eos: np.ndarray) -> CompiledForm | None:
    """The compact form of a constraint object, made once per object (None: it keeps the
    object path)."""
    if constraint not in _LOWERED:
        # the width the object knows: a plugin's table, a built-in's form
        owner = getattr(constraint, "table", None) or getattr(constraint, "form", None)
        vocab = getattr(owner, "vocab_size", 0)
        _LOWERED[constraint] = constraint.lower(key=f"object:{uuid.uuid4().hex}",
                                                vocab_size=vocab,
                                                eos_token_ids=tuple(eos.tolist()))
    return _LOWERED[constraint]


class ConstraintBatch:
    """Constraint state for up to ``capacity`` slots (batch rows or request slots)."""

    def __init__(self, eos_token_ids: tuple[int, ...], capacity: int = 8) -> None:
        self.eos = np.sort(np.asarray(eos_token_ids, dtype=np.int64))  # sorted: see allowed
        # compiled forms by id: their arrays at that index of one typed list per field
        self._lists = {name: typed.List.empty_list(t) for name, t in bk.LIST_TYPES.items()}
        self._empty = {name: np.zeros(0, dtype=dtype) for name, dtype in FIELDS.items()}
        self.meta = np.zeros((0, bk.META_COLUMNS), dtype=np.int64)
        self._fid: dict[str, int] = {}  # form key -> form id
        self._forms: list[CompiledForm | None] = []
        self._refs: list[int] = []  # slots holding each form
        self._free_fids: list[int] = []
        self._alive = typed.List.empty_list(types.int32[::1])  # per slot (distinct_items)
        # Python constraints (plugins with their own state): per slot, and handles by group
        self._py: list[Constraint | None] = []
        self._py_handles: dict[int, tuple[list[int], list[int]]] = {}  # id -> (free, [next])
        self._num_py = 0
        self._active: np.ndarray | None = None
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        def grown(name: str, fill: int) -> np.ndarray:
            new = np.full(capacity, fill, dtype=np.int64)
            old = getattr(self, name, None)
            if old is not None:
                new[: len(old)] = old
            return new

        self._active = None
        self.form = grown("form", EMPTY)
        self.handle = grown("handle", EMPTY)
        self.state = grown("state", DEAD)
        self.consumed = grown("consumed", 0)
        self.last_token = grown("last_token", EMPTY)
        self.count = grown("count", 0)
        while len(self._alive) < capacity:
            self._alive.append(_NO_ALIVE)
        self._py.extend([None] * (capacity - len(self._py)))

    @property
    def num_forms(self) -> int:
        """Distinct compiled forms held by the batch's slots now."""
        return len(self._fid)

    # --- batch makeup (called when the engine changes the batch, not every step) ---

    def add(self, slot: int, form: CompiledForm) -> None:
        """Put a new request in ``slot`` (replacing any occupant), at its form's start."""
        self._make_room(slot)
        fid = self._adopt(form)
        self.form[slot] = fid
        self._refs[fid] += 1
        self._alive[slot] = (form.arrays["base_alive"].copy() if form.kind == DISTINCT
                             else _NO_ALIVE)
        self._restart(np.array([slot]))

    def add_constraint(self, slot: int, constraint: Constraint) -> None:
        """Put a request with a compiled :class:`Constraint` in ``slot``: by its compact form
        where it has one, else on the per-constraint Python path."""
        form = _lowered(constraint, self.eos)
        if form is not None:
            self.add(slot, form)
            return
        self._make_room(slot)
        free, nxt = self._py_handles.setdefault(id(constraint), ([], [0]))
        h = free.pop() if free else nxt[0]
        nxt[0] += h == nxt[0]
        self.form[slot], self.handle[slot] = PYTHON, h
        self._py[slot] = constraint
        self._num_py += 1
        self._restart(np.array([slot]))

    def _make_room(self, slot: int) -> None:
        if slot >= len(self.form):
            self._grow(max(slot + 1, 2 * len(self.form)))
        self.remove(slot)
        self._active = None

    def _adopt(self, form: CompiledForm) -> int:
        fid = self._fid.get(form.key)
        if fid is not None:
            return fid
        fid = self._free_fids.pop() if self._free_fids else len(self._forms)
        if fid == len(self._forms):
            self._forms.append(None)
            self._refs.append(0)
            self.meta = np.concatenate([self.meta, np.zeros((1, bk.META_COLUMNS), np.int64)])
            for name, lst in self._lists.items():
                lst.append(form.arrays[name])
        else:
            for name, lst in self._lists.items():
                lst[fid] = form.arrays[name]
        self.meta[fid] = bk.meta_row(form)
        self._forms[fid] = form
        self._fid[form.key] = fid
        return fid

    def remove(self, slot: int) -> None:
        """Empty ``slot``; a no-op if it holds no constrained request."""
        if slot >= len(self.form) or self.form[slot] == EMPTY:
            return
        fid = int(self.form[slot])
        if fid == PYTHON:
            c = self._py[slot]
            assert c is not None
            h = int(self.handle[slot])
            c.release(np.array([h]))
            free, nxt = self._py_handles[id(c)]
            free.append(h)
            if len(free) == nxt[0]:
                del self._py_handles[id(c)]  # its last request left
            self._py[slot] = None
            self._num_py -= 1
        else:
            self._refs[fid] -= 1
            if self._refs[fid] == 0:  # the form's last request left: let it be freed
                form = self._forms[fid]
                assert form is not None
                del self._fid[form.key]
                self._forms[fid] = None
                for name, lst in self._lists.items():
                    lst[fid] = self._empty[name]
                self._free_fids.append(fid)
            self._alive[slot] = _NO_ALIVE
        self.form[slot] = self.handle[slot] = EMPTY
        self._active = None

    def move(self, src: int, dst: int) -> None:
        """One-way move: ``dst`` takes ``src``'s request (its occupant is dropped)."""
        if max(src, dst) >= len(self.form):
            self._grow(max(src, dst) + 1)
        self.remove(dst)
        for a in self._slot_arrays():
            a[dst] = a[src]
        self._alive[dst], self._alive[src] = self._alive[src], _NO_ALIVE
        self._py[dst], self._py[src] = self._py[src], None
        self.form[src] = self.handle[src] = EMPTY
        self._active = None

    def swap(self, a: int, b: int) -> None:
        if max(a, b) >= len(self.form):
            self._grow(max(a, b) + 1)
        for arr in self._slot_arrays():
            arr[[a, b]] = arr[[b, a]]
        self._alive[a], self._alive[b] = self._alive[b], self._alive[a]
        self._py[a], self._py[b] = self._py[b], self._py[a]
        self._active = None

    def _slot_arrays(self) -> tuple[np.ndarray, ...]:
        return self.form, self.handle, self.state, self.consumed, self.last_token, self.count

    def active_slots(self) -> np.ndarray:
        """Slots holding a constrained request, ascending."""
        if self._active is None:
            self._active = np.flatnonzero(self.form != EMPTY)
        return self._active

    def holds(self, slots: np.ndarray) -> np.ndarray:
        """Whether each of ``slots`` (any non-negative ints) holds a constrained request."""
        inside = slots < len(self.form)
        out = np.zeros(len(slots), dtype=bool)
        out[inside] = self.form[slots[inside]] != EMPTY
        return out

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
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        if not self._num_py:
            return self._compiled_allowed(slots)
        py = self.form[slots] == PYTHON
        at = np.flatnonzero(~py)
        parts_r, parts_t = [], []
        if len(at):
            rows, tokens = self._compiled_allowed(slots[at])
            parts_r, parts_t = [at[rows]], [tokens]
        for c, m in self._python_groups(slots[py]):
            where = np.flatnonzero(py)[m]
            r, t = self._python_allowed(c, slots[where])
            parts_r.append(where[r])
            parts_t.append(t)
        return np.concatenate(parts_r), np.concatenate(parts_t)

    def peek(self, parents: np.ndarray, drafts: np.ndarray, depth: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
        """Allowed ``(position into parents, token)`` pairs after each parent slot's committed
        state is stepped through its first ``depth[i]`` draft tokens (``drafts[i, :depth]``),
        without changing the slot: speculative decoding's draft rows.

        One compiled pass for every row (``kernels.peek``): each row steps a local copy of its
        parent's state, so the cost is the rows' draft steps and their allowed tokens, as for
        committed rows. A parent on the Python path (a plugin constraint with its own state,
        which cannot be copied) gets EOS alone: the request ends rather than risk an answer its
        constraint does not allow.
        """
        parents = np.ascontiguousarray(parents, dtype=np.int64)
        if len(parents) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        drafts = np.ascontiguousarray(drafts, dtype=np.int64)
        depth = np.ascontiguousarray(depth, dtype=np.int64)
        python = self.form[parents] == PYTHON if self._num_py else None
        if python is not None and python.any():
            compiled = np.flatnonzero(~python)
            rows, tokens = self._compiled_peek(parents[compiled], drafts[compiled],
                                               depth[compiled])
            ended = np.flatnonzero(python)
            return (np.concatenate([compiled[rows], np.repeat(ended, len(self.eos))]),
                    np.concatenate([tokens, np.tile(self.eos, len(ended))]))
        return self._compiled_peek(parents, drafts, depth)

    def _compiled_peek(self, parents: np.ndarray, drafts: np.ndarray, depth: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
        li = self._lists
        return bk.peek(parents, drafts, depth, self.form, self.state, self.count, self.meta,
                       li["offsets"], li["tokens"], li["targets"], li["accepting"],
                       li["guard"], li["item_of_node"], li["path_offsets"], li["path_nodes"],
                       self._alive, self.eos)

    def _compiled_allowed(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        li = self._lists
        return bk.allowed(slots, self.form, self.state, self.count, self.meta, li["offsets"],
                          li["tokens"], li["targets"], li["accepting"], li["guard"],
                          self._alive, self.eos)

    def _python_allowed(self, c: Constraint, slots: np.ndarray) -> tuple[np.ndarray,
                                                                           np.ndarray]:
        s, h = self.state[slots], self.handle[slots]
        live = np.flatnonzero(s != DEAD)
        r, t = c.allowed(h[live], s[live])
        r = live[r]
        need_eos = np.ones(len(slots), dtype=bool)
        need_eos[r] = False
        need_eos[live] |= c.is_accepting(h[live], s[live])
        eos_rows = np.flatnonzero(need_eos)
        k = len(self.eos)
        return (np.concatenate([r, np.repeat(eos_rows, k)]),
                np.concatenate([t, np.tile(self.eos, len(eos_rows))]).astype(np.int64))

    def _python_groups(self, slots: np.ndarray) -> list[tuple[Constraint, np.ndarray]]:
        """Python constraints among ``slots`` with a mask of their slots (one per constraint:
        the only per-constraint loop of a step)."""
        owners = [self._py[s] for s in slots.tolist()]
        groups: dict[int, tuple[Constraint, list[int]]] = {}
        for i, c in enumerate(owners):
            assert c is not None
            groups.setdefault(id(c), (c, []))[1].append(i)
        out = []
        for c, idx in groups.values():
            m = np.zeros(len(slots), dtype=bool)
            m[idx] = True
            out.append((c, m))
        return out

    def _restart(self, slots: np.ndarray) -> None:
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        py = self.form[slots] == PYTHON if self._num_py else None
        compiled = slots if py is None else slots[~py]
        if len(compiled):
            bk.restart(compiled, self.form, self.state, self.count, self.consumed,
                       self.last_token, self.meta, self._lists["base_alive"], self._alive)
        if py is not None and py.any():
            for c, m in self._python_groups(slots[py]):
                at = slots[py][m]
                self.state[at] = c.start(self.handle[at])
                self.consumed[at] = 0
                self.last_token[at] = EMPTY

    def _advance(self, slots: np.ndarray, tokens: np.ndarray) -> None:
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)
        py = self.form[slots] == PYTHON if self._num_py else None
        compiled = slots if py is None else slots[~py]
        li = self._lists
        if len(compiled):
            bk.advance(compiled, tokens if py is None else tokens[~py], self.form, self.state,
                       self.count, self.consumed, self.last_token, self.meta, li["offsets"],
                       li["tokens"], li["targets"], li["guard"], li["item_of_node"],
                       li["path_offsets"], li["path_nodes"], self._alive)
        if py is not None and py.any():
            at, toks = slots[py], tokens[py]
            for c, m in self._python_groups(at):
                s = self.state[at[m]]
                live = s != DEAD
                nxt = np.full(len(s), DEAD, dtype=np.int64)
                if live.any():
                    nxt[live] = c.advance(self.handle[at[m]][live], s[live], toks[m][live])
                self.state[at[m]] = nxt
                self.consumed[at[m]] += 1
                self.last_token[at[m]] = toks[m]
