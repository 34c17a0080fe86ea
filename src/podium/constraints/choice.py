"""``choice``: exactly one of N strings, through a trie of their token sequences.

Each string is tokenized the way the tokenizer itself would (canonical BPE), and the trie
of those sequences is the state machine: a node is a state, a child token an edge, a node
that ends a string accepts. Building it is one batch tokenization plus one dict walk, which
keeps 10,000 strings well under half a second.
"""

from __future__ import annotations

import numpy as np

from podium.constraints.base import TableConstraint
from podium.constraints.table import TokenTable
from podium.constraints.vocab import TokenizerInfo


def build_trie(sequences: list[list[int]], vocab_size: int) -> tuple[TokenTable, np.ndarray]:
    """Trie of token sequences as a table; also each sequence's final node."""
    children: dict[tuple[int, int], int] = {}
    edges: list[tuple[int, int, int]] = []
    ends = np.empty(len(sequences), dtype=np.int64)
    num_nodes = 1
    for i, seq in enumerate(sequences):
        node = 0
        for tok in seq:
            key = (node, tok)
            child = children.get(key)
            if child is None:
                child = children[key] = num_nodes
                edges.append((node, tok, child))
                num_nodes += 1
            node = child
        ends[i] = node
    table = TokenTable.from_edges(num_nodes, edges, ends.tolist(), 0, vocab_size)
    return table, ends


class ChoiceConstraint(TableConstraint):
    """Output exactly one of ``choices``."""

    def __init__(self, choices: list[str], tok: TokenizerInfo) -> None:
        self.choices = choices
        table, _ = build_trie(tok.encode_exact(choices), tok.vocab_size)
        super().__init__(table)
