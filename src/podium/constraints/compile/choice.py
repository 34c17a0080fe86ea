"""``choice``: exactly one of N strings, through a trie of their token sequences.

Each string is tokenized the way the tokenizer itself would (canonical BPE), and the trie
of those sequences is the state machine: a node is a state, a child token an edge, a node
that ends a string accepts. Building it is one batch tokenization (memoized per string), a
sort of the sequences and one compiled pass over them.
"""

from __future__ import annotations

import numpy as np

from podium.constraints import kernels
from podium.constraints.compile.base import FormConstraint
from podium.constraints.compile.form import table_form
from podium.constraints.compile.table import TokenTable
from podium.constraints.compile.vocab import TokenizerInfo, TokenRuns


def trie(runs: TokenRuns, first: int) -> tuple[np.ndarray, ...]:
    """The trie of token sequences, built over all of them at once.

    Nodes are numbered from ``first``; a sequence's first token hangs off parent -1 (the
    caller's root). Returns ``(offsets, nodes, parents, tokens, children)``: ``nodes`` holds,
    flattened like ``sequences`` (``offsets``), the node each token leads to; the last three
    are the trie's edges.

    The sequences are sorted as rows of one padded matrix (its rows as byte strings: in some
    order of tokens, which is all a trie needs, rows sharing a prefix are neighbours; three
    times faster than np.lexsort); then one compiled pass (``kernels.trie_nodes``) walks them
    in that order, each sharing exactly its common prefix with the row before. The pass
    replaced a dozen whole-matrix numpy passes: 0.8 ms of a 500-candidate compile's 3.3 ms.
    """
    num, offsets, flat = len(runs), runs.offsets, runs.flat
    lengths = np.diff(offsets)
    width = int(lengths.max(initial=0))
    empty = np.zeros(0, dtype=np.int64)
    if width == 0:
        return offsets, empty.copy(), empty, empty, empty
    inside = np.arange(width) < lengths[:, None]
    rows = np.full((num, width), -1, dtype=np.int64)  # -1 past the end
    rows[inside] = flat
    order = np.argsort(rows.view(np.dtype((np.void, rows.itemsize * width))).ravel(),
                       kind="stable")
    nodes, parents, tokens, children = kernels.trie_nodes(offsets, flat, order, width, first)
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


class ChoiceConstraint(FormConstraint):
    """Output exactly one of ``choices``: the trie's table as a compiled form."""

    def __init__(self, choices: list[str], tok: TokenizerInfo) -> None:
        self.choices = choices
        table, _ = build_trie(tok.encode_runs(choices), tok.vocab_size)
        super().__init__(table_form(table))
