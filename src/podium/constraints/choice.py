"""``choice``: exactly one of N strings, through a trie of their token sequences.

Each string is tokenized the way the tokenizer itself would (canonical BPE), and the trie
of those sequences is the state machine: a node is a state, a child token an edge, a node
that ends a string accepts. Building it is one batch tokenization (memoized per string) plus
a constant number of numpy passes over the sorted sequences.
"""

from __future__ import annotations

import numpy as np

from podium.constraints.base import TableConstraint
from podium.constraints.table import TokenTable
from podium.constraints.vocab import TokenizerInfo, TokenRuns


def trie(runs: TokenRuns, first: int) -> tuple[np.ndarray, ...]:
    """The trie of token sequences, built over all of them at once (numpy).

    Nodes are numbered from ``first``; a sequence's first token hangs off parent -1 (the
    caller's root). Returns ``(offsets, nodes, parents, tokens, children)``: ``nodes`` holds,
    flattened like ``sequences`` (``offsets``), the node each token leads to; the last three
    are the trie's edges.

    The sequences are laid out as rows of one padded matrix and sorted; in sorted order a row
    shares with the row before it exactly their common prefix, so the row's tokens past that
    prefix are new nodes, and a token inside it reuses the node of the last row that created
    one at its depth. A constant number of array passes, whatever the depth of the trie.
    """
    num, offsets, flat = len(runs), runs.offsets, runs.flat
    lengths = np.diff(offsets)
    width = int(lengths.max(initial=0))
    empty = np.zeros(0, dtype=np.int64)
    if width == 0:
        return offsets, empty.copy(), empty, empty, empty
    inside = np.arange(width) < lengths[:, None]
    rows = np.full((num, width), -1, dtype=np.int64)  # -1 past the end sorts before any token
    rows[inside] = flat
    # rows as byte strings sort lexicographically (in some order of tokens: all a trie needs
    # is that rows sharing a prefix are neighbours), three times faster than np.lexsort
    order = np.argsort(rows.view(np.dtype((np.void, rows.itemsize * width))).ravel(),
                       kind="stable")
    rows, inside, lengths = rows[order], inside[order], lengths[order]
    # common prefix with the row before (0 for the first row)
    same = np.zeros((num, width + 1), dtype=bool)
    same[1:, :width] = (rows[1:] == rows[:-1]) & inside[1:]
    common = np.argmin(same, axis=1)
    depth = np.arange(width)
    new = inside & (depth >= common[:, None])
    ids = np.full((num, width), -1, dtype=np.int64)
    ids[new] = np.arange(first, first + int(new.sum()), dtype=np.int64)
    # inside a shared prefix: the node of the last row above that created one at this depth
    creator = np.where(new, np.arange(num)[:, None], -1)
    np.maximum.accumulate(creator, axis=0, out=creator)
    node_of = ids[np.maximum(creator, 0), depth]
    children = ids[new]
    parent_of = np.concatenate([np.full((num, 1), -1, dtype=np.int64), node_of[:, :-1]], axis=1)
    parents, tokens = parent_of[new], rows[new]
    where = np.empty(num, dtype=np.int64)
    where[order] = np.arange(num)  # sorted row of each sequence
    nodes = node_of[where][inside[where]]  # flattened in the sequences' own order again
    return offsets, nodes, parents, tokens, children


def build_trie(runs: TokenRuns, vocab_size: int) -> tuple[TokenTable, np.ndarray]:
    """Trie of token sequences as a table (root 0); also each sequence's final node."""
    offsets, nodes, parents, tokens, children = trie(runs, 1)
    parents = np.where(parents < 0, 0, parents)
    ends = nodes[offsets[1:] - 1] if len(runs) else np.zeros(0, dtype=np.int64)
    edges = np.stack([parents, tokens, children], axis=1)
    num_nodes = 1 + len(children)
    table = TokenTable.from_edges(num_nodes, edges, ends, 0, vocab_size)
    return table, ends


class ChoiceConstraint(TableConstraint):
    """Output exactly one of ``choices``."""

    def __init__(self, choices: list[str], tok: TokenizerInfo) -> None:
        self.choices = choices
        table, _ = build_trie(tok.encode_runs(choices), tok.vocab_size)
        super().__init__(table)
