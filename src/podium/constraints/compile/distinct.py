"""``distinct_items``: a JSON array of ``min..max`` strings from a candidate set, none twice.

A grammar cannot say "no repeats" without listing every ordering; a state machine can: the
token graph is fixed (``[`` item (``, `` item)* ``]``, each item a trie of its JSON string's
tokens), and each request additionally keeps, for every trie node, how many of its unused
items lie below it. An edge into a node with none left is masked; finishing an item
subtracts one along that item's path. Each segment (``[``, ``, ``, ``]``, every item) is
tokenized on its own, so the output is their concatenation, byte for byte.

The constraint is its compiled form (kind ``DISTINCT``): the table, a guard per edge, the item
each node completes and every item's path; the batch kernels step it
(:mod:`podium.constraints.kernels`).
"""

from __future__ import annotations

import json

import numpy as np

from podium.constraints import kernels
from podium.constraints.compile.base import FormConstraint
from podium.constraints.compile.choice import trie
from podium.constraints.compile.form import DISTINCT, CompiledForm, form_arrays
from podium.constraints.compile.table import TokenTable
from podium.constraints.compile.vocab import TokenizerInfo, TokenRuns

OPEN, SEPARATOR, CLOSE = "[", ", ", "]"
_PLAIN, _ITEM, _SEP, _CLOSE = kernels.PLAIN, kernels.ITEM, kernels.SEP, kernels.CLOSE  # guards


def render(items: list[str]) -> str:
    """The exact text a ``distinct_items`` constraint produces for ``items``."""
    return OPEN + SEPARATOR.join(json.dumps(i, ensure_ascii=False) for i in items) + CLOSE


class DistinctItemsConstraint(FormConstraint):
    """Output a JSON array of ``min_items..max_items`` distinct strings from ``items``."""

    def __init__(self, items: list[str], min_items: int, max_items: int,
                 tok: TokenizerInfo) -> None:
        if len(set(items)) != len(items):
            raise ValueError("distinct_items candidates must be unique")
        self.items, self.min_items = items, min_items
        self.max_items = min(max_items, len(items))
        item_runs = tok.encode_runs(items, quoted=True)  # each as its JSON string literal
        open_seq, sep_seq, close_seq = tok.encode_exact([OPEN, SEPARATOR, CLOSE])
        super().__init__(self._build(item_runs, open_seq, sep_seq, close_seq, tok.vocab_size))

    def _build(self, item_runs: TokenRuns, open_seq: list[int], sep_seq: list[int],
               close_seq: list[int], vocab_size: int) -> CompiledForm:
        edges: list[tuple[int, int, int, int]] = []  # (source, token, target, guard)
        n = 0

        def new() -> int:
            nonlocal n
            n += 1
            return n - 1

        def path(src: int, seq: list[int], dst: int, first_guard: int) -> None:
            for i, tok in enumerate(seq):
                nxt = dst if i == len(seq) - 1 else new()
                edges.append((src, tok, nxt, first_guard if i == 0 else _PLAIN))
                src = nxt

        start, after_open, item_start, after_item, done = (new() for _ in range(5))
        path(start, open_seq, after_open, _PLAIN)
        path(after_open, close_seq, done, _CLOSE)
        path(after_item, sep_seq, item_start, _SEP)
        path(after_item, close_seq, done, _CLOSE)
        # the item trie (numbered from n); its first level hangs off after_open and item_start
        offsets, nodes, parents, tokens, children = trie(item_runs, n)
        roots = parents < 0
        fixed = np.array(edges, dtype=np.int64).reshape(-1, 4)
        item = np.full(len(children), _ITEM, dtype=np.int64)
        arr = np.concatenate([
            fixed,
            np.stack([np.where(roots, after_open, parents), tokens, children, item], axis=1),
            np.stack([np.full(int(roots.sum()), item_start), tokens[roots], children[roots],
                      item[roots]], axis=1)])
        n += len(children)
        table = TokenTable.from_edges(n, arr[:, :3], [done], start, vocab_size)
        guard = np.zeros(table.num_edges, dtype=np.int8)
        guard[table.edge_index(arr[:, 0], arr[:, 1])] = arr[:, 3]
        leaves = nodes[offsets[1:] - 1]
        item_of_node = np.full(n, -1, dtype=np.int64)
        item_of_node[leaves] = np.arange(len(item_runs))
        arrays = form_arrays(
            offsets=table.offsets, tokens=table.tokens, targets=table.targets,
            accepting=table.accepting, guard=guard, item_of_node=item_of_node,
            path_offsets=offsets, path_nodes=nodes,
            base_alive=np.bincount(nodes, minlength=n))  # unused items below each node
        return CompiledForm(key="", kind=DISTINCT, arrays=arrays, start=table.start,
                            after_item=after_item, min_items=self.min_items,
                            max_items=self.max_items, vocab_size=vocab_size)
