"""Compiled loops over a batch's rows, for the per-step hot path of token tables.

Each kernel is one pass over the rows in machine code (numba, already an engine dependency),
without the GIL: what a chain of a dozen numpy calls did with temporaries, a loop does in
place. Compiled on first use and cached beside this file, so an engine pays the compile
(about a second) once per installation, not per process.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def edge_index(offsets: np.ndarray, tokens: np.ndarray, states: np.ndarray,
               query: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Index of the edge each ``(states[i], query[i])`` takes, or -1 where none leaves."""
    out = np.empty(len(states), dtype=np.int64)
    for i in range(len(states)):
        s, q = states[i], query[i]
        out[i] = -1
        if s < 0 or q < 0:
            continue
        lo, hi = offsets[s], offsets[s + 1]
        while lo < hi:  # the tokens of one state are sorted
            mid = (lo + hi) >> 1
            if tokens[mid] < q:
                lo = mid + 1
            else:
                hi = mid
        if lo < offsets[s + 1] and tokens[lo] == q:
            out[i] = lo
    return out


@njit(nogil=True, cache=True)
def step(offsets: np.ndarray, tokens: np.ndarray, targets: np.ndarray, states: np.ndarray,
         query: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """The state each ``(states[i], query[i])`` edge leads to, or -1 where none leaves."""
    edges = edge_index(offsets, tokens, states, query)
    out = np.empty(len(states), dtype=np.int64)
    for i in range(len(states)):
        out[i] = targets[edges[i]] if edges[i] >= 0 else -1
    return out


@njit(nogil=True, cache=True)
def accepting_of(accepting: np.ndarray, states: np.ndarray) -> np.ndarray:  # pragma: no cover
    """Whether each row's state accepts (False for a negative state)."""
    out = np.zeros(len(states), dtype=np.bool_)
    for i in range(len(states)):
        if states[i] >= 0:
            out[i] = accepting[states[i]]
    return out


@njit(nogil=True, cache=True)
def table_allowed(offsets: np.ndarray, tokens: np.ndarray, accepting: np.ndarray,
                  states: np.ndarray,
                  eos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    """Every row's allowed ``(row, token)`` pairs under one token table: its state's tokens,
    plus ``eos`` where the state accepts; ``eos`` alone where no token leaves (or no state).
    Rows come in order, each with its tokens ascending (``eos`` must be sorted)."""
    total = 0
    for i in range(len(states)):
        s = states[i]
        n = offsets[s + 1] - offsets[s] if s >= 0 else 0
        total += n + (len(eos) if n == 0 or accepting[s] else 0)
    rows = np.empty(total, dtype=np.int64)
    out = np.empty(total, dtype=np.int64)
    k = 0
    for i in range(len(states)):
        s = states[i]
        lo = hi = 0
        if s >= 0:
            lo, hi = offsets[s], offsets[s + 1]
        with_eos = hi == lo or accepting[s]
        e, j = lo, 0  # merge the state's sorted tokens with the sorted EOS ids
        while e < hi or (with_eos and j < len(eos)):
            take_eos = with_eos and j < len(eos) and (e == hi or eos[j] < tokens[e])
            rows[k] = i
            out[k] = eos[j] if take_eos else tokens[e]
            j += take_eos
            e += not take_eos
            k += 1
    return rows, out


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


# distinct_items edge guards (see podium.constraints.distinct)
PLAIN, ITEM, SEP, CLOSE = 0, 1, 2, 3


@njit(nogil=True, cache=True)
def _permits(guard: int, target: int, h: int, alive: np.ndarray, used: int, min_items: int,
             max_items: int) -> bool:  # pragma: no cover - compiled
    if guard == ITEM:
        return alive[h, target] > 0
    if guard == SEP:
        return used < max_items
    if guard == CLOSE:
        return used >= min_items
    return True


@njit(nogil=True, cache=True)
def distinct_allowed(offsets: np.ndarray, tokens: np.ndarray, targets: np.ndarray,
                     guard: np.ndarray, alive: np.ndarray, count: np.ndarray,
                     handles: np.ndarray, states: np.ndarray, min_items: int,
                     max_items: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    """``distinct_items``' allowed ``(row, token)`` pairs: each row's edges its guards pass."""
    total = 0
    for i in range(len(states)):
        if states[i] >= 0:
            total += offsets[states[i] + 1] - offsets[states[i]]
    rows = np.empty(total, dtype=np.int64)
    out = np.empty(total, dtype=np.int64)
    k = 0
    for i in range(len(states)):
        s, h = states[i], handles[i]
        if s < 0:
            continue
        for e in range(offsets[s], offsets[s + 1]):
            if _permits(guard[e], targets[e], h, alive, count[h], min_items, max_items):
                rows[k] = i
                out[k] = tokens[e]
                k += 1
    return rows[:k], out[:k]


@njit(nogil=True, cache=True)
def distinct_advance(offsets: np.ndarray, tokens: np.ndarray, targets: np.ndarray,
                     guard: np.ndarray, alive: np.ndarray, count: np.ndarray,
                     item_of_node: np.ndarray, path_offsets: np.ndarray,
                     path_nodes: np.ndarray, after_item: int, handles: np.ndarray,
                     states: np.ndarray, query: np.ndarray, min_items: int,
                     max_items: int) -> np.ndarray:  # pragma: no cover - compiled
    """``distinct_items``' step: the next state of each row (-1 where its token is not
    allowed); a completed item is used up along its whole path, in place."""
    edges = edge_index(offsets, tokens, states, query)
    out = np.empty(len(states), dtype=np.int64)
    for i in range(len(states)):
        e, h = edges[i], handles[i]
        if e < 0 or not _permits(guard[e], targets[e], h, alive, count[h], min_items,
                                 max_items):
            out[i] = -1
            continue
        out[i] = targets[e]
        item = item_of_node[out[i]]
        if item >= 0:
            for j in range(path_offsets[item], path_offsets[item + 1]):
                alive[h, path_nodes[j]] -= 1
            count[h] += 1
            out[i] = after_item
    return out


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
    empty = np.zeros(0, dtype=np.int64)
    one = np.zeros(2, dtype=np.int64)
    edge_index(one, empty, empty, empty)
    step(one, empty, empty, empty, empty)
    accepting_of(np.zeros(1, dtype=np.bool_), empty)
    table_allowed(one, empty, np.zeros(1, dtype=np.bool_), empty, empty)
    alive = np.zeros((1, 1), dtype=np.int32)
    distinct_allowed(one, empty, empty, np.zeros(0, dtype=np.int8), alive, empty, empty, empty,
                     0, 0)
    distinct_advance(one, empty, empty, np.zeros(0, dtype=np.int8), alive, empty, empty, one,
                     empty, 0, empty, empty, empty, 0, 0)
    keep_only_rows(np.zeros((1, 1), dtype=np.float32), empty, empty, empty)
    trie_nodes(np.zeros(1, dtype=np.int64), empty, empty, 0, 0)
