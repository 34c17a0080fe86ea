"""The compiled loops of constraints (numba): the ONE kernel set, for compile and engine alike.

- the batch step (``advance``, ``allowed``, ``restart``): one pass over every slot of a batch,
  each slot with its own compiled form (:mod:`podium.constraints.compile.form`), whatever the
  number of distinct forms among them. This is the only step implementation of the built-in
  constraint types: the engine's batch runs it, and so does a built-in constraint object asked
  directly (:class:`~podium.constraints.compile.base.FormConstraint`). A slot refers to its
  form by a form id: the form's arrays sit at that index of typed lists (one list per field),
  and its scalars in a row of ``meta``. A ``distinct_items`` slot also owns its ``alive``
  counts (unused items below each node);
- ``edge_index``: the same edge search for a plugin's :class:`~podium.constraints.compile.table.
  TokenTable` (the object path);
- ``keep_only_rows``: the mask on CPU logits; ``trie_nodes``: the trie a ``choice`` compiles to.

Each kernel is one pass in machine code without the GIL. Compiled on first use and cached
beside this file, so an engine pays the compile (about a second a kernel) once per
installation, not per process; :func:`warm` compiles them all (``scripts/install.sh``).
This module sits below ``compile`` and ``engine`` (both use it), so neither imports the
other for its loops; its path is also the one ``scripts/install.sh`` warms.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types

# columns of meta: the form's start state, its after-item state, min/max items, kind
START, AFTER_ITEM, MIN_ITEMS, MAX_ITEMS, KIND = range(5)
META_COLUMNS = 5
DISTINCT_KIND = 1
"""``meta[f, KIND]`` of a ``distinct_items`` form (``compile.form.DISTINCT``)."""

# distinct_items edge guards (see podium.constraints.compile.distinct)
PLAIN, ITEM, SEP, CLOSE = 0, 1, 2, 3

LIST_TYPES = {
    "offsets": types.int32[::1], "tokens": types.int32[::1], "targets": types.int32[::1],
    "accepting": types.boolean[::1], "guard": types.int8[::1],
    "item_of_node": types.int32[::1], "path_offsets": types.int32[::1],
    "path_nodes": types.int32[::1], "base_alive": types.int32[::1],
}
"""The numba type of each field of a compiled form (``compile.form.FIELDS``), as the typed
lists the batch kernels take hold them: one list per field, one entry per form."""


def meta_row(form: Any) -> tuple[int, int, int, int, int]:
    """A compiled form's row of ``meta`` (columns ``START`` .. ``KIND``)."""
    return form.start, form.after_item, form.min_items, form.max_items, form.kind


@njit(nogil=True, cache=True, inline="always")
def _edge(offsets: np.ndarray, tokens: np.ndarray, s: int, q: int) -> int:  # pragma: no cover
    lo, hi = offsets[s], offsets[s + 1]
    end = hi
    while lo < hi:  # a state's tokens are sorted
        mid = (lo + hi) >> 1
        if tokens[mid] < q:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < end and tokens[lo] == q else -1


@njit(nogil=True, cache=True, inline="always")
def _permits(guard: int, target: int, alive: np.ndarray, used: int, min_items: int,
             max_items: int) -> bool:  # pragma: no cover - compiled
    if guard == ITEM:
        return alive[target] > 0
    if guard == SEP:
        return used < max_items
    if guard == CLOSE:
        return used >= min_items
    return True


@njit(nogil=True, cache=True)
def advance(slots, query, form, state, count, consumed, last_token, meta, offsets_l, tokens_l,
            targets_l, guard_l, item_of_node_l, path_offsets_l, path_nodes_l,
            alive_l) -> None:  # pragma: no cover - compiled
    """Every slot takes its token: next state (-1 where not allowed), item bookkeeping."""
    for i in range(len(slots)):
        s, q = slots[i], query[i]
        f, st = form[s], state[s]
        consumed[s] += 1
        last_token[s] = q
        if st < 0 or q < 0:
            state[s] = -1
            continue
        e = _edge(offsets_l[f], tokens_l[f], st, q)
        if e < 0:
            state[s] = -1
            continue
        target = targets_l[f][e]
        g = guard_l[f][e]
        if g != PLAIN and not _permits(g, target, alive_l[s], count[s], meta[f, MIN_ITEMS],
                                       meta[f, MAX_ITEMS]):
            state[s] = -1
            continue
        if meta[f, KIND] == DISTINCT_KIND:
            item = item_of_node_l[f][target]
            if item >= 0:  # an item is complete: use it up along its whole path
                po, pn, alive = path_offsets_l[f], path_nodes_l[f], alive_l[s]
                for j in range(po[item], po[item + 1]):
                    alive[pn[j]] -= 1
                count[s] += 1
                target = meta[f, AFTER_ITEM]
        state[s] = target


@njit(nogil=True, cache=True)
def allowed(slots, form, state, count, meta, offsets_l, tokens_l, targets_l, accepting_l,
            guard_l, alive_l, eos):  # pragma: no cover - compiled
    """Allowed ``(position into slots, token)`` pairs, each row's tokens ascending: its state's
    permitted edges, EOS merged in where the state accepts; EOS alone where nothing is
    permitted (complete, or a dead state). ``eos`` must be sorted."""
    total = 0
    for i in range(len(slots)):
        s = slots[i]
        st = state[s]
        if st >= 0:
            off = offsets_l[form[s]]
            total += off[st + 1] - off[st]
        total += len(eos)
    rows = np.empty(total, dtype=np.int64)
    out = np.empty(total, dtype=np.int64)
    k = 0
    for i in range(len(slots)):
        s = slots[i]
        st = state[s]
        first = k
        j = 0
        acc = False
        if st >= 0:
            f = form[s]
            off, tok, tgt, guard = offsets_l[f], tokens_l[f], targets_l[f], guard_l[f]
            acc = accepting_l[f][st]
            mn, mx = meta[f, MIN_ITEMS], meta[f, MAX_ITEMS]
            for e in range(off[st], off[st + 1]):
                g = guard[e]
                if g != PLAIN and not _permits(g, tgt[e], alive_l[s], count[s], mn, mx):
                    continue
                t = tok[e]
                while acc and j < len(eos) and eos[j] < t:
                    rows[k] = i
                    out[k] = eos[j]
                    j += 1
                    k += 1
                rows[k] = i
                out[k] = t
                k += 1
        if acc or k == first:
            while j < len(eos):
                rows[k] = i
                out[k] = eos[j]
                j += 1
                k += 1
    return rows[:k], out[:k]


@njit(nogil=True, cache=True)
def restart(slots, form, state, count, consumed, last_token, meta, base_alive_l,
            alive_l) -> None:  # pragma: no cover - compiled
    """Put every slot back at its form's start (history to be replayed from scratch)."""
    for i in range(len(slots)):
        s = slots[i]
        f = form[s]
        state[s] = meta[f, START]
        count[s] = 0
        consumed[s] = 0
        last_token[s] = -1
        if meta[f, KIND] == DISTINCT_KIND:
            alive_l[s][:] = base_alive_l[f]


@njit(nogil=True, cache=True)
def edge_index(offsets: np.ndarray, tokens: np.ndarray, states: np.ndarray,
               query: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Index of the edge each ``(states[i], query[i])`` takes, or -1 where none leaves."""
    out = np.empty(len(states), dtype=np.int64)
    for i in range(len(states)):
        s, q = states[i], query[i]
        out[i] = _edge(offsets, tokens, s, q) if s >= 0 and q >= 0 else -1
    return out


@njit(nogil=True, cache=True)
def keep_only_rows(logits: np.ndarray, rows: np.ndarray, keep_rows: np.ndarray,
                   keep_tokens: np.ndarray) -> None:  # pragma: no cover - compiled
    """In place: every logit of ``rows`` becomes -inf except the ``(keep_rows[i],
    keep_tokens[i])`` pairs. Each row is written only in the gaps between its kept tokens, so
    the kept logits are never read back: the whole mask is one streaming write, the floor."""
    num_rows, width = logits.shape
    start = np.zeros(num_rows + 1, dtype=np.int64)
    for i in range(len(keep_rows)):
        start[keep_rows[i] + 1] += 1
    for r in range(num_rows):
        start[r + 1] += start[r]
    bucketed = np.empty(len(keep_rows), dtype=np.int64)
    fill = start[:-1].copy()
    for i in range(len(keep_rows)):
        bucketed[fill[keep_rows[i]]] = keep_tokens[i]
        fill[keep_rows[i]] += 1
    for r in rows:
        kept = bucketed[start[r]:start[r + 1]]
        for j in range(1, len(kept)):
            if kept[j] < kept[j - 1]:  # token tables list a state's tokens sorted already
                kept = np.sort(kept)
                break
        gap = 0
        for t in kept:
            if t > gap:
                logits[r, gap:t] = -np.inf
            gap = max(gap, t + 1)  # a token kept twice leaves an empty gap
        if gap < width:
            logits[r, gap:] = -np.inf


@njit(nogil=True, cache=True)
def trie_nodes(offsets: np.ndarray, flat: np.ndarray, order: np.ndarray, width: int,
               first: int) -> tuple[np.ndarray, ...]:  # pragma: no cover - compiled
    """The trie of the sequences ``flat[offsets[i]:offsets[i + 1]]``, visited in ``order``
    (an order in which sequences sharing a prefix are neighbours, as a sort gives): each
    sequence shares with the one visited before it exactly their common prefix, so its
    tokens past that prefix are new nodes (numbered from ``first`` in visiting order) and
    those inside it reuse the previous one's nodes. Returns (the node each token leads to,
    flattened like ``flat``; and the edges: parents, tokens, children)."""
    total = offsets[len(offsets) - 1]
    nodes = np.empty(total, dtype=np.int64)
    parents = np.empty(total, dtype=np.int64)
    tokens = np.empty(total, dtype=np.int64)
    children = np.empty(total, dtype=np.int64)
    path = np.empty(max(width, 1), dtype=np.int64)  # the previous sequence's node per depth
    num_new = 0
    prev = -1
    for r in range(len(order)):
        i = order[r]
        lo, length = offsets[i], offsets[i + 1] - offsets[i]
        common = 0
        if prev >= 0:
            plo, plength = offsets[prev], offsets[prev + 1] - offsets[prev]
            while (common < length and common < plength
                   and flat[lo + common] == flat[plo + common]):
                common += 1
        for d in range(length):
            if d >= common:
                node = first + num_new
                parents[num_new] = path[d - 1] if d > 0 else -1
                tokens[num_new] = flat[lo + d]
                children[num_new] = node
                num_new += 1
                path[d] = node
            nodes[lo + d] = path[d]
        prev = i
    return nodes, parents[:num_new], tokens[:num_new], children[:num_new]


def warm() -> None:
    """Compile (or load from the cache) every kernel now, e.g. at install time."""
    from numba import typed

    empty = np.zeros(0, dtype=np.int64)
    one = np.zeros(2, dtype=np.int64)
    li = {name: typed.List([np.zeros(1, dtype=t.dtype.name)]) for name, t in LIST_TYPES.items()}
    meta = np.zeros((1, META_COLUMNS), dtype=np.int64)
    advance(empty, empty, empty, empty, empty, empty, empty, meta, li["offsets"], li["tokens"],
            li["targets"], li["guard"], li["item_of_node"], li["path_offsets"],
            li["path_nodes"], li["base_alive"])
    allowed(empty, empty, empty, empty, meta, li["offsets"], li["tokens"], li["targets"],
            li["accepting"], li["guard"], li["base_alive"], empty)
    restart(empty, empty, empty, empty, empty, empty, meta, li["base_alive"], li["base_alive"])
    edge_index(one, empty, empty, empty)
    keep_only_rows(np.zeros((1, 1), dtype=np.float32), empty, empty, empty)
    trie_nodes(np.zeros(1, dtype=np.int64), empty, empty, 0, 0)
