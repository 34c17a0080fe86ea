"""``regex``: the pattern's character DFA (interegular) lifted to a token-level table.

From each DFA state reachable from the start, every vocabulary token is run through the DFA
at once: a numpy step per character position over the tokens still alive, so most of the
vocabulary drops out at its first character. Only states from which an accepting state is
still reachable count as alive, so decoding can never steer into a dead end.
(outlines-core 0.2.14 was tried first: its index drops some single-character tokens, e.g.
``b`` after ``a`` in ``a(bc)?``, so its tables reject strings of the language.)
"""

from __future__ import annotations

from collections import deque

import numpy as np

from podium.constraints.base import TableConstraint
from podium.constraints.table import TokenTable
from podium.constraints.vocab import TokenizerInfo


def compile_regex(pattern: str, tok: TokenizerInfo) -> TokenTable:
    """Token table of the strings that fully match ``pattern``."""
    import interegular

    fsm = interegular.parse_pattern(pattern).to_fsm()
    trans, initial, finals = _dense_dfa(fsm, pattern)
    chars = tok.token_chars
    symbols = _symbols(fsm.alphabet, chars.unique_codes)[chars.code_index]
    dead = trans.shape[0] - 1
    dense = {initial: 0}
    queue = deque([initial])
    edges = []
    while queue:
        q = queue.popleft()
        ends = _run_all(trans, symbols, chars.lengths, q, dead)
        ok = np.flatnonzero(ends != dead)
        for s in np.unique(ends[ok]).tolist():
            if s not in dense:
                dense[s] = len(dense)
                queue.append(s)
        target = np.fromiter((dense[s] for s in ends[ok].tolist()), np.int64, len(ok))
        edges.append(np.stack([np.full(len(ok), dense[q]), chars.ids[ok], target], axis=1))
    accepting = [dense[s] for s in finals if s in dense]
    return TokenTable.from_edges(len(dense), np.concatenate(edges), accepting, 0,
                                 tok.vocab_size)


def _dense_dfa(fsm, pattern: str) -> tuple[np.ndarray, int, list[int]]:
    """Transition matrix [state, symbol] with a final absorbing dead row; dead-end states
    (no accepting state reachable) are mapped to dead."""
    states = sorted(fsm.states)
    index = {s: i for i, s in enumerate(states)}
    live = _live(fsm)
    if fsm.initial not in live:
        raise ValueError(f"regex {pattern!r} matches no string")
    num_symbols = len(set(fsm.alphabet.values()))
    dead = len(states)
    trans = np.full((len(states) + 1, num_symbols), dead, dtype=np.int64)
    for s, moves in fsm.map.items():
        for sym, t in moves.items():
            if t in live and s in live:
                trans[index[s], sym] = index[t]
    return trans, index[fsm.initial], [index[s] for s in fsm.finals if s in live]


def _symbols(alphabet, codes: np.ndarray) -> np.ndarray:
    """The DFA symbol of each code point; -1 (padding, or a character the pattern can never
    consume) stops the walk."""
    from interegular.fsm import anything_else

    other = alphabet.get(anything_else, -1)
    return np.array([-1 if c < 0 else alphabet.get(chr(c), other) for c in codes.tolist()],
                    dtype=np.int64)


def _run_all(trans: np.ndarray, symbols: np.ndarray, lengths: np.ndarray, start: int,
             dead: int) -> np.ndarray:
    """State after each token's full text, starting from ``start`` (``dead`` if it fails)."""
    state = np.full(len(lengths), start, dtype=np.int64)
    alive = np.arange(len(lengths))
    for pos in range(symbols.shape[1]):
        alive = alive[lengths[alive] > pos]
        if len(alive) == 0:
            break
        sym = symbols[alive, pos]
        nxt = np.where(sym >= 0, trans[state[alive], np.maximum(sym, 0)], dead)
        state[alive] = nxt
        alive = alive[nxt != dead]
    return state


def _live(fsm) -> set:
    """States from which some accepting state can be reached."""
    reverse: dict = {}
    for s, moves in fsm.map.items():
        for t in moves.values():
            reverse.setdefault(t, set()).add(s)
    live = set(fsm.finals)
    queue = deque(live)
    while queue:
        for p in reverse.get(queue.popleft(), ()):
            if p not in live:
                live.add(p)
                queue.append(p)
    return live


class RegexConstraint(TableConstraint):
    """Output a string that fully matches ``pattern``."""

    def __init__(self, pattern: str, tok: TokenizerInfo) -> None:
        self.pattern = pattern
        super().__init__(compile_regex(pattern, tok))
