"""A pattern's character DFA, built by interegular within a bound on its states.

interegular builds every machine (a concatenation, a star, a repeat, the reduction) through one
function, ``interegular.fsm.crawl``. As shipped (0.3.3) it numbers each new state by
``list.index`` over the states found so far, quadratic in their number, and has no bound: a
20-character pattern such as ``[ab]*a[ab]{20}`` needs 2**21 states and kept a core busy for
good (measured: 8,193 states took 6.5 s, 2**21 never finished). Podium's crawl numbers states
the same way, in the same order (the machines are identical; tested), with a dict, and stops
once a build finds more than ``max_states`` states. It replaces interegular's at first use;
with no bound set (other users of interegular in the process) it only runs faster.
"""

from __future__ import annotations

import threading
from typing import Any

MAX_REGEX_STATES = 2_000
"""DFA states a ``regex`` constraint may need (a machine interegular builds on the way counts
too): past it the pattern is refused. ``[a-z]{1,100}`` needs 101, ``[ab]*a[ab]{10}`` 2,049."""


class TooManyStates(ValueError):
    """A pattern's DFA needs more states than allowed."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


_bound = threading.local()
_install_lock = threading.Lock()


def character_dfa(pattern: str, max_states: int = MAX_REGEX_STATES) -> Any:
    """The reduced character DFA (an ``interegular.FSM``) of ``pattern``; TooManyStates when a
    step of its construction finds more than ``max_states`` states."""
    import interegular

    _install()
    _bound.max_states = max_states
    try:
        return interegular.parse_pattern(pattern).to_fsm()
    finally:
        _bound.max_states = None


_interegular_crawl: Any = None
"""interegular's own crawl, kept once replaced (the tests compare machines with it)."""


def _install() -> None:
    global _interegular_crawl
    import interegular.fsm

    with _install_lock:
        if interegular.fsm.crawl is not _crawl:
            _interegular_crawl = interegular.fsm.crawl
            interegular.fsm.crawl = _crawl


def _crawl(alphabet: Any, initial: Any, final: Any, follow: Any) -> Any:
    """interegular's crawl: states numbered breadth first as found, through a dict."""
    from interegular.fsm import FSM, OblivionError

    limit = getattr(_bound, "max_states", None)
    states = [initial]
    numbers = {_key(initial): 0}
    finals: set[int] = set()
    transitions: dict[int, dict[Any, int]] = {}
    i = 0
    while i < len(states):
        state = states[i]
        if final(state):
            finals.add(i)
        moves = transitions[i] = {}
        for transition in alphabet.by_transition:
            try:
                new = follow(state, transition)
            except OblivionError:  # no state: the transition is not listed
                continue
            key = _key(new)
            j = numbers.get(key)
            if j is None:
                j = numbers[key] = len(states)
                states.append(new)
                if limit is not None and len(states) > limit:
                    raise TooManyStates(limit)
            moves[transition] = j
        i += 1
    return FSM(alphabet=alphabet, states=range(len(states)), initial=0, finals=finals,
               map=transitions, __no_validation__=True)


def _key(state: Any) -> Any:
    """A hashable stand-in equal where the states are equal (``list.index`` compares with
    ==): the parallel and complement builds' states are dicts {machine: substate}, a star's
    first state a set (equal to the frozenset of the same members)."""
    if isinstance(state, dict):
        return frozenset(state.items())
    if isinstance(state, set):
        return frozenset(state)
    return state
