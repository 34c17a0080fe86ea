"""``regex``: the pattern's character DFA (interegular) lifted to a token-level table.

From each DFA state reachable from the start, every vocabulary token is run through the DFA
at once: a numpy step per character position over the tokens still alive, so most of the
vocabulary drops out at its first character. Only states from which an accepting state is
still reachable count as alive, so decoding can never steer into a dead end.
(outlines-core 0.2.14 was tried first: its index drops some single-character tokens, e.g.
``b`` after ``a`` in ``a(bc)?``, so its tables reject strings of the language.)

Both stages are bounded, so a hostile pattern costs a refusal, not a core: the DFA's states
(:data:`~podium.constraints.compile.regex_dfa.MAX_REGEX_STATES`) and the table's token steps
(:data:`MAX_REGEX_WORK`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from podium.constraints.compile.base import FormConstraint
from podium.constraints.compile.form import table_form
from podium.constraints.compile.regex_dfa import TooManyStates, character_dfa
from podium.constraints.compile.table import TokenTable
from podium.constraints.compile.vocab import TokenizerInfo

MAX_REGEX_WORK = 100_000_000
"""Token steps the table may take: each DFA state's walk counts every vocabulary token at each
of its characters while the token stays alive. About 10 s of one core here (~1e7 steps/s);
``[a-z]{1,100}`` takes 1e7, ``[^"]{0,200}`` 6.5e7."""


class RegexTooComplex(ValueError):
    """A pattern whose DFA or token table is past its bound (the request's 400)."""


def compile_regex(pattern: str, tok: TokenizerInfo) -> TokenTable:
    """Token table of the strings that fully match ``pattern``."""
    try:
        fsm = character_dfa(pattern)
    except TooManyStates as exc:
        raise RegexTooComplex(
            f"regex {pattern!r} needs a DFA of more than {exc.limit:,} states (a "
            "repeat after a wildcard, such as [ab]*a[ab]{20}, doubles them per repeat); "
            "simplify it or use a choice constraint") from None
    trans, initial, finals = _dense_dfa(fsm, pattern)
    chars = tok.token_chars
    symbols = _symbols(fsm.alphabet, chars.unique_codes)[chars.code_index]
    dead = trans.shape[0] - 1
    dense = {initial: 0}
    queue = deque([initial])
    edges = []
    work = 0
    while queue:
        q = queue.popleft()
        ends, steps = _run_all(trans, symbols, chars.lengths, q, dead)
        work += steps
        if work > MAX_REGEX_WORK:
            raise RegexTooComplex(
                f"regex {pattern!r} is too costly to lift to tokens: past {MAX_REGEX_WORK:,} "
                f"token steps after {len(dense):,} of its DFA states (long repeats of broad "
                "classes such as [^\"]{0,500} cost the most); bound its repeats")
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
             dead: int) -> tuple[np.ndarray, int]:
    """State after each token's full text, starting from ``start`` (``dead`` if it fails),
    and the token steps it took."""
    state = np.full(len(lengths), start, dtype=np.int64)
    alive = np.arange(len(lengths))
    steps = 0
    for pos in range(symbols.shape[1]):
        alive = alive[lengths[alive] > pos]
        if len(alive) == 0:
            break
        steps += len(alive)
        sym = symbols[alive, pos]
        nxt = np.where(sym >= 0, trans[state[alive], np.maximum(sym, 0)], dead)
        state[alive] = nxt
        alive = alive[nxt != dead]
    return state, steps


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


class RegexConstraint(FormConstraint):
    """Output a string that fully matches ``pattern``: its token table as a compiled form."""

    def __init__(self, pattern: str, tok: TokenizerInfo) -> None:
        self.pattern = pattern
        super().__init__(table_form(compile_regex(pattern, tok)))
