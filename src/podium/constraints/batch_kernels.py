"""The batch step in compiled loops over every slot at once, each slot with its own form.

A slot refers to its compiled form by a form id: the form's arrays sit at that index of typed
lists (one list per field), and its scalars in a row of ``meta``. ``advance``, ``allowed`` and
``restart`` each make one pass over the slots they are given, whatever the number of distinct
forms among them, so the Python work of a step does not grow with the number of specs.
A ``distinct_items`` slot also owns its ``alive`` counts (unused items below each node).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from podium.constraints.kernels import CLOSE, ITEM, PLAIN, SEP

# columns of meta: the form's start state, its after-item state, min/max items, kind
START, AFTER_ITEM, MIN_ITEMS, MAX_ITEMS, KIND = range(5)
META_COLUMNS = 5
DISTINCT_KIND = 1


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
