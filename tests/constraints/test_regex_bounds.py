"""A hostile `regex` costs a refusal, not a core: admission only parses (it runs on the event
loop), the DFA has a bound on its states, the token table a bound on its steps. Before, the
DFA was built at admission, on the loop: `[ab]*a[ab]{20}` (2**21 states, interegular's crawl
quadratic in them) held a real server's loop for good, /health included."""

from __future__ import annotations

import interegular
import interegular.fsm
import pytest

from podium.constraints.compile import regex, regex_dfa
from podium.constraints.compile.regex_dfa import TooManyStates, character_dfa
from podium.constraints.spec.admission import validate_constraint
from podium.constraints.spec.builtins import BUILTIN_TYPES
from podium.errors import InvalidArgument

EXPONENTIAL = "[ab]*a[ab]{20}"  # the n-th letter from the end: 2**21 states

SAME_MACHINE = ["[0-9]+", "a(bc)?", "(ab|cd)*e{2,5}", "[a-z]{1,12}@[a-z]+\\.(com|org)",
                "(\\w+ ){1,5}", "[ab]*a[ab]{4}", "x|y|z", "(a|b)*(c|d)+"]


@pytest.mark.parametrize("pattern", SAME_MACHINE)
def test_the_bounded_crawl_builds_the_machine_interegular_builds(
        pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = character_dfa(pattern)
    monkeypatch.setattr(interegular.fsm, "crawl", regex_dfa._interegular_crawl)
    theirs = interegular.parse_pattern(pattern).to_fsm()
    assert (ours.initial, ours.finals, ours.map) == (theirs.initial, theirs.finals, theirs.map)
    assert list(ours.states) == list(theirs.states)


def test_admission_only_parses_so_an_exponential_pattern_is_admitted_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def crawl(*args: object) -> None:
        raise AssertionError("admission built a DFA (on the event loop)")

    monkeypatch.setattr(interegular.fsm, "crawl", crawl)
    assert validate_constraint({"type": "regex", "pattern": EXPONENTIAL})["pattern"] == EXPONENTIAL


def test_an_exponential_dfa_stops_at_the_state_bound() -> None:
    with pytest.raises(TooManyStates):
        character_dfa(EXPONENTIAL)
    assert len(character_dfa("[ab]*a[ab]{9}").states) == 1025  # within: built
    with pytest.raises(TooManyStates):
        character_dfa("[ab]*a[ab]{9}", max_states=1000)


def test_the_bound_holds_only_inside_podium_builds() -> None:
    character_dfa("[0-9]+")  # installs the crawl
    assert interegular.fsm.crawl is regex_dfa._crawl
    assert len(interegular.parse_pattern("[ab]*a[ab]{11}").to_fsm().states) == 4097


def test_compiling_an_exponential_pattern_is_a_400_on_its_pattern(tok) -> None:
    compile_regex = next(t for t in BUILTIN_TYPES if t.name == "regex").compile
    with pytest.raises(InvalidArgument) as caught:
        compile_regex({"type": "regex", "pattern": EXPONENTIAL}, tok)
    assert caught.value.param == "constraint.pattern"
    assert "more than 2,000 states" in caught.value.message
    assert "[ab]*a[ab]{20}" in caught.value.message


def test_a_table_past_its_token_steps_is_a_400(tok, monkeypatch: pytest.MonkeyPatch) -> None:
    compile_regex = next(t for t in BUILTIN_TYPES if t.name == "regex").compile
    spec = {"type": "regex", "pattern": "[a-z]{1,40}"}
    assert compile_regex(spec, tok) is not None  # ~4e6 steps
    monkeypatch.setattr(regex, "MAX_REGEX_WORK", 1_000_000)
    with pytest.raises(InvalidArgument) as caught:
        compile_regex(spec, tok)
    assert caught.value.param == "constraint.pattern"
    assert "past 1,000,000 token steps" in caught.value.message


@pytest.mark.parametrize("depth", [1000, 4000])
def test_groups_nested_past_the_parser_are_a_400_at_admission(depth: int) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_constraint({"type": "regex", "pattern": "(" * depth + "a" + ")" * depth})
    assert caught.value.param == "constraint.pattern"
    assert "nested too deeply" in caught.value.message
