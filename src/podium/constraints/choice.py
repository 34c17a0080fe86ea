"""``choice``: exactly one of N strings, through a trie of their token sequences.

Each string is tokenized the way the tokenizer itself would (canonical BPE), and the trie
of those sequences is the state machine: a node is a state, a child token an edge, a node
that ends a string accepts. Building it is one batch tokenization (memoized per string) plus
one numpy pass per depth of the trie.
"""

from __future__ import annotations

import itertools

import numpy as np

from podium.constraints.base import TableConstraint
from podium.constraints.table import TokenTable
from podium.constraints.vocab import TokenizerInfo


def trie(sequences: list[list[int]], first: int, vocab_size: int) -> tuple[np.ndarray, ...]:
    """The trie of token sequences, built one depth at a time over all of them (numpy).

    Nodes are numbered from ``first``; a sequence's first token hangs off parent -1 (the
    caller's root). Returns ``(offsets, nodes, parents, tokens, children)``: ``nodes`` holds,
    flattened like ``sequences`` (``offsets``), the node each token leads to; the last three
    are the trie's edges.
    """
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64,
                       count=int(offsets[-1]))
    nodes = np.empty(len(flat), dtype=np.int64)
    parent = np.full(len(sequences), -1, dtype=np.int64)
    idx = np.arange(len(sequences))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    nxt = first
    for depth in range(int(lengths.max(initial=0))):
        idx = idx[lengths[idx] > depth]
        pos = offsets[idx] + depth
        toks = flat[pos]
        # sequences sharing (parent, token) share the child
        uniq, first_of, inv = np.unique((parent[idx] + 1) * vocab_size + toks,
                                        return_index=True, return_inverse=True)
        child = nxt + inv
        nodes[pos] = child
        parts.append((parent[idx][first_of], toks[first_of],
                      np.arange(nxt, nxt + len(uniq), dtype=np.int64)))
        parent[idx] = child
        nxt += len(uniq)
    empty = np.zeros(0, dtype=np.int64)
    cols = [np.concatenate([p[k] for p in parts]) if parts else empty for k in range(3)]
    return offsets, nodes, cols[0], cols[1], cols[2]


def build_trie(sequences: list[list[int]], vocab_size: int) -> tuple[TokenTable, np.ndarray]:
    """Trie of token sequences as a table (root 0); also each sequence's final node."""
    offsets, nodes, parents, tokens, children = trie(sequences, 1, vocab_size)
    parents = np.where(parents < 0, 0, parents)
    ends = nodes[offsets[1:] - 1] if len(sequences) else np.zeros(0, dtype=np.int64)
    edges = np.stack([parents, tokens, children], axis=1)
    num_nodes = 1 + len(children)
    table = TokenTable.from_edges(num_nodes, edges, ends, 0, vocab_size)
    return table, ends


class ChoiceConstraint(TableConstraint):
    """Output exactly one of ``choices``."""

    def __init__(self, choices: list[str], tok: TokenizerInfo) -> None:
        self.choices = choices
        table, _ = build_trie(tok.encode_exact(choices), tok.vocab_size)
        super().__init__(table)
