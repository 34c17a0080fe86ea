"""The sorted-rows trie against the plainest trie there is: a dict of prefixes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from podium.constraints.compile.choice import trie
from podium.constraints.compile.vocab import TokenRuns

SEQUENCES = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=7), max_size=40)


@settings(max_examples=300, deadline=None)
@given(sequences=SEQUENCES, first=st.integers(0, 9))
def test_every_prefix_is_one_node_and_every_edge_extends_its_parent(
        sequences: list[list[int]], first: int) -> None:
    offsets, nodes, parents, tokens, children = trie(TokenRuns.of(sequences), first)
    node_of: dict[tuple[int, ...], int] = {}
    for i, seq in enumerate(sequences):
        for depth in range(len(seq)):
            node = int(nodes[offsets[i] + depth])
            assert node_of.setdefault(tuple(seq[: depth + 1]), node) == node  # shared prefix
    assert len(set(node_of.values())) == len(node_of)  # distinct prefixes, distinct nodes
    expected = {(node_of.get(p[:-1], -1), p[-1], n) for p, n in node_of.items()}
    edges = set(zip(parents.tolist(), tokens.tolist(), children.tolist(), strict=True))
    assert edges == expected and len(children) == len(expected)
    assert sorted(children.tolist()) == list(range(first, first + len(children)))


def test_no_sequences_make_no_nodes() -> None:
    offsets, nodes, parents, tokens, children = trie(TokenRuns.of([]), 3)
    assert offsets.tolist() == [0]
    assert len(nodes) == len(parents) == len(tokens) == len(children) == 0
