"""The compiled loops of constraints (numba): the ONE kernel set, for compile and engine alike.

- the batch step (``advance``, ``allowed``, ``restart``; ``peek`` for speculative decoding's
  draft rows): one pass over every slot of a batch,
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


@njit(nogil=True, cache=True, inline="always")
def _step(f, st, used, q, meta, offsets_l, tokens_l, targets_l, guard_l, item_of_node_l,
          path_offsets_l, path_nodes_l, alive):  # pragma: no cover - compiled
    """One slot of form ``f`` in state ``st`` with ``used`` items takes token ``q``: its next
    state (-1 where not allowed), items used, and the item it completed (-1: none), whose
    path is then used up in ``alive``."""
    if st < 0 or q < 0:
        return -1, used, -1
    e = _edge(offsets_l[f], tokens_l[f], st, q)
    if e < 0:
        return -1, used, -1
    target = targets_l[f][e]
    g = guard_l[f][e]
    if g != PLAIN and not _permits(g, target, alive, used, meta[f, MIN_ITEMS],
                                   meta[f, MAX_ITEMS]):
        return -1, used, -1
    item = -1
    if meta[f, KIND] == DISTINCT_KIND:
        item = item_of_node_l[f][target]
        if item >= 0:  # an item is complete: use it up along its whole path
            po, pn = path_offsets_l[f], path_nodes_l[f]
            for j in range(po[item], po[item + 1]):
                alive[pn[j]] -= 1
            used += 1
            target = meta[f, AFTER_ITEM]
    return target, used, item


@njit(nogil=True, cache=True)
def advance(slots, query, form, state, count, consumed, last_token, meta, offsets_l, tokens_l,
            targets_l, guard_l, item_of_node_l, path_offsets_l, path_nodes_l,
            alive_l) -> None:  # pragma: no cover - compiled
    """Every slot takes its token: next state (-1 where not allowed), item bookkeeping."""
    for i in range(len(slots)):
        s, q = slots[i], query[i]
        consumed[s] += 1
        last_token[s] = q
        state[s], count[s], _ = _step(form[s], state[s], count[s], q, meta, offsets_l,
                                      tokens_l, targets_l, guard_l, item_of_node_l,
                                      path_offsets_l, path_nodes_l, alive_l[s])


@njit(nogil=True, cache=True, inline="always")
def _width(f, st, offsets_l, eos) -> int:  # pragma: no cover - compiled
    """The most pairs ``_emit`` writes for a slot of form ``f`` in state ``st``."""
    n = len(eos)
    if st >= 0:
        off = offsets_l[f]
        n += off[st + 1] - off[st]
    return n


@njit(nogil=True, cache=True, inline="always")
def _emit(i, f, st, used, meta, offsets_l, tokens_l, targets_l, accepting_l, guard_l, alive,
          eos, rows, out, k) -> int:  # pragma: no cover - compiled
    """Write row ``i``'s allowed tokens at ``rows[k:]`` / ``out[k:]`` (ascending: the state's
    permitted edges, EOS merged in where it accepts, EOS alone where nothing is permitted);
    return the new end."""
    first = k
    j = 0
    acc = False
    if st >= 0:
        off, tok, tgt, guard = offsets_l[f], tokens_l[f], targets_l[f], guard_l[f]
        acc = accepting_l[f][st]
        mn, mx = meta[f, MIN_ITEMS], meta[f, MAX_ITEMS]
        for e in range(off[st], off[st + 1]):
            g = guard[e]
            if g != PLAIN and not _permits(g, tgt[e], alive, used, mn, mx):
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
    return k


@njit(nogil=True, cache=True)
def allowed(slots, form, state, count, meta, offsets_l, tokens_l, targets_l, accepting_l,
            guard_l, alive_l, eos):  # pragma: no cover - compiled
    """Allowed ``(position into slots, token)`` pairs, each row's tokens ascending: its state's
    permitted edges, EOS merged in where the state accepts; EOS alone where nothing is
    permitted (complete, or a dead state). ``eos`` must be sorted."""
    total = 0
    for i in range(len(slots)):
        s = slots[i]
        total += _width(form[s], state[s], offsets_l, eos)
    rows = np.empty(total, dtype=np.int64)
    out = np.empty(total, dtype=np.int64)
    k = 0
    for i in range(len(slots)):
        s = slots[i]
        k = _emit(i, form[s], state[s], count[s], meta, offsets_l, tokens_l, targets_l,
                  accepting_l, guard_l, alive_l[s], eos, rows, out, k)
    return rows[:k], out[:k]


@njit(nogil=True, cache=True, inline="always")
def _give_back(f, done, n, path_offsets_l, path_nodes_l, alive) -> None:  # pragma: no cover
    """Undo ``_step``'s use of the items ``done[:n]`` in ``alive``."""
    po, pn = path_offsets_l[f], path_nodes_l[f]
    for m in range(n):
        for j in range(po[done[m]], po[done[m] + 1]):
            alive[pn[j]] += 1


@njit(nogil=True, cache=True)
def peek(parents, drafts, depth, form, state, count, meta, offsets_l, tokens_l, targets_l,
         accepting_l, guard_l, item_of_node_l, path_offsets_l, path_nodes_l, alive_l,
         eos):  # pragma: no cover - compiled
    """``allowed`` for rows that are their parent slot stepped through ``drafts[i, :depth[i]]``,
    leaving every slot as it was: speculative decoding's draft rows, in one pass.

    A row's state and item count are locals; the items its drafts complete are used up in
    the parent's own ``alive`` counts while that row is queried, then given back, so no row
    copies its parent's counts. A row that extends the row before it (same parent, the same
    drafts and more: offsets 1, 2, 3 of a request, as the runner lays them out) goes on from
    where that one stopped instead of from the parent. ``eos`` must be sorted."""
    cap = 0
    for i in range(len(parents)):
        s = parents[i]
        cap += _width(form[s], state[s], offsets_l, eos)  # a guess: drafts move the state
    rows = np.empty(max(cap, 16), dtype=np.int64)
    out = np.empty(max(cap, 16), dtype=np.int64)
    done = np.empty(max(drafts.shape[1], 1), dtype=np.int64)  # items the chain's drafts used
    k = 0
    n = 0  # items used
    chain, last, stepped = -1, -1, 0  # the chain's parent, its last row, drafts stepped
    f, st, used = 0, -1, 0
    alive = alive_l[0] if len(alive_l) else np.zeros(0, dtype=np.int32)
    for i in range(len(parents)):
        s = parents[i]
        extends = s == chain and depth[i] >= stepped
        if extends:
            for d in range(stepped):
                if drafts[i, d] != drafts[last, d]:
                    extends = False
                    break
        if not extends:
            if n:
                _give_back(f, done, n, path_offsets_l, path_nodes_l, alive)
            f, alive = form[s], alive_l[s]
            st, used, n, stepped, chain = state[s], count[s], 0, 0, s
        for d in range(stepped, depth[i]):
            if st < 0:
                break
            st, used, item = _step(f, st, used, drafts[i, d], meta, offsets_l, tokens_l,
                                   targets_l, guard_l, item_of_node_l, path_offsets_l,
                                   path_nodes_l, alive)
            if item >= 0:
                done[n] = item
                n += 1
        stepped, last = depth[i], i
        need = k + _width(f, st, offsets_l, eos)
        if need > len(rows):
            size = max(need, 2 * len(rows))
            grown_rows = np.empty(size, dtype=np.int64)
            grown_out = np.empty(size, dtype=np.int64)
            grown_rows[:k] = rows[:k]
            grown_out[:k] = out[:k]
            rows, out = grown_rows, grown_out
        k = _emit(i, f, st, used, meta, offsets_l, tokens_l, targets_l, accepting_l, guard_l,
                  alive, eos, rows, out, k)
    if n:  # give the last chain's parent back its items
        _give_back(f, done, n, path_offsets_l, path_nodes_l, alive)
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
    peek(empty, np.zeros((0, 1), dtype=np.int64), empty, empty, empty, empty, meta,
         li["offsets"], li["tokens"], li["targets"], li["accepting"], li["guard"],
         li["item_of_node"], li["path_offsets"], li["path_nodes"], li["base_alive"], empty)
    restart(empty, empty, empty, empty, empty, empty, meta, li["base_alive"], li["base_alive"])
    edge_index(one, empty, empty, empty)
    keep_only_rows(np.zeros((1, 1), dtype=np.float32), empty, empty, empty)
    trie_nodes(np.zeros(1, dtype=np.int64), empty, empty, 0, 0)
