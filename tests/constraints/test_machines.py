"""The built-in state machines against the default model's tokenizer.

Property tests in both directions: every string the machine lets through is in the language
(random walks over the allowed sets, decoded), and every string of the language is let through
(its tokenization walks to an accepting state).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podium.constraints.compile.choice import ChoiceConstraint
from podium.constraints.compile.compiler import ConstraintCompiler
from podium.constraints.compile.distinct import (
    CLOSE,
    OPEN,
    SEPARATOR,
    DistinctItemsConstraint,
    render,
)
from podium.constraints.compile.regex import RegexConstraint
from podium.constraints.compile.vocab import TokenizerInfo
from tests.support.catalog import make_titles
from tests.support.walk import Walker

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
TITLES = make_titles(3000)
picker = st.randoms(use_true_random=False)
# the tokenizer drops some control characters and cannot round-trip unassigned code points;
# such strings are refused at compile time (test_strings_the_tokenizer_cannot_produce...)
TEXT = st.text(st.characters(exclude_categories=("Cs", "Co", "Cn", "Cc")), min_size=1, max_size=12)


# --- choice ---

@pytest.fixture(scope="module")
def catalog(tok: TokenizerInfo) -> ChoiceConstraint:
    return ChoiceConstraint(TITLES, tok)


@SETTINGS
@given(rnd=picker)
def test_choice_every_walk_ends_on_a_title(catalog: ChoiceConstraint, tok: TokenizerInfo,
                                           rnd) -> None:
    w = Walker(catalog, tok.eos_token_ids)
    assert tok.decode(w.sample(rnd.choice)) in set(TITLES)


@SETTINGS
@given(title=st.sampled_from(TITLES))
def test_choice_every_title_is_accepted(catalog: ChoiceConstraint, tok: TokenizerInfo,
                                        title: str) -> None:
    assert Walker(catalog, tok.eos_token_ids).accepts(tok.encode_batch([title])[0])


@SETTINGS
@given(choices=st.lists(TEXT, min_size=1, max_size=20,
                        unique=True), rnd=picker)
def test_choice_of_arbitrary_unicode_strings(tok: TokenizerInfo, choices: list[str],
                                             rnd) -> None:
    c = ChoiceConstraint(choices, tok)
    for s in choices:
        assert Walker(c, tok.eos_token_ids).accepts(tok.encode_batch([s])[0]), s
    out = Walker(c, tok.eos_token_ids).sample(rnd.choice)
    assert tok.decode(out) in choices


def test_strings_the_tokenizer_cannot_produce_are_refused(tok: TokenizerInfo) -> None:
    # this tokenizer drops \x16; distinct_items is immune (JSON escapes it as \u0016)
    with pytest.raises(ValueError, match="cannot produce"):
        ChoiceConstraint(["fine", "8\x16"], tok)
    c = DistinctItemsConstraint(["fine", "8\x16"], 1, 2, tok)
    assert Walker(c, tok.eos_token_ids).accepts(_segments(tok, ["8\x16"]))


def test_choice_where_one_title_prefixes_another(tok: TokenizerInfo) -> None:
    c = ChoiceConstraint(["Heat", "Heat Wave"], tok)
    w = Walker(c, tok.eos_token_ids)
    heat = tok.encode_batch(["Heat"])[0]
    for t in heat:
        w.take(t)
    allowed = w.allowed()
    # after "Heat" the model may stop or go on to " Wave"
    assert set(tok.eos_token_ids) < allowed and len(allowed) > len(tok.eos_token_ids)


def test_choice_complete_allows_only_eos(catalog: ChoiceConstraint, tok: TokenizerInfo) -> None:
    w = Walker(catalog, tok.eos_token_ids)
    for t in tok.encode_batch([TITLES[0]])[0]:
        w.take(t)
    if not any(t.startswith(TITLES[0]) and t != TITLES[0] for t in TITLES):
        assert w.allowed() == set(tok.eos_token_ids)


def test_choice_rejects_a_token_off_the_trie(catalog: ChoiceConstraint,
                                             tok: TokenizerInfo) -> None:
    w = Walker(catalog, tok.eos_token_ids)
    off = tok.encode_batch(["Zebra"])[0][0]
    assert off not in w.allowed()


def test_choice_of_10000_titles_is_compiled_once_per_catalog(tok: TokenizerInfo) -> None:
    # how long preparing takes is measured by bench/constraints_prepare.py
    compiler = ConstraintCompiler(tok)
    spec = {"type": "choice", "choices": make_titles(10_000)}
    first = compiler.compile(spec)
    again = compiler.compile(json.loads(json.dumps(spec)))  # the same catalog, a new request
    assert again is first
    w = Walker(first, tok.eos_token_ids)
    assert w.accepts(tok.encode_batch([spec["choices"][1234]])[0])


def test_choice_of_100000_titles_compiles(tok: TokenizerInfo) -> None:
    titles = make_titles(100_000)
    c = ChoiceConstraint(titles, tok)
    w = Walker(c, tok.eos_token_ids)
    assert w.accepts(tok.encode_batch([titles[-1]])[0])


# --- distinct_items ---

def _segments(tok: TokenizerInfo, items: list[str]) -> list[int]:
    parts = [OPEN]
    for i, item in enumerate(items):
        parts += ([SEPARATOR] if i else []) + [json.dumps(item, ensure_ascii=False)]
    parts.append(CLOSE)
    return [t for seq in tok.encode_batch(parts) for t in seq]


@SETTINGS
@given(data=st.data(), rnd=picker)
def test_distinct_items_every_walk_is_a_valid_array(tok: TokenizerInfo, data, rnd) -> None:
    items = data.draw(st.lists(st.sampled_from(TITLES[:200]), min_size=1, max_size=8,
                               unique=True))
    lo = data.draw(st.integers(0, len(items)))
    hi = data.draw(st.integers(max(lo, 1), len(items)))
    c = DistinctItemsConstraint(items, lo, hi, tok)
    text = tok.decode(Walker(c, tok.eos_token_ids).sample(rnd.choice))
    value = json.loads(text)
    assert lo <= len(value) <= hi
    assert len(set(value)) == len(value) and set(value) <= set(items)
    assert text == render(value)


@SETTINGS
@given(data=st.data())
def test_distinct_items_every_valid_array_is_accepted(tok: TokenizerInfo, data) -> None:
    items = data.draw(st.lists(TEXT, min_size=1, max_size=8,
                               unique=True))
    lo = data.draw(st.integers(0, len(items)))
    hi = data.draw(st.integers(max(lo, 1), len(items)))
    chosen = data.draw(st.permutations(items))[: data.draw(st.integers(lo, hi))]
    c = DistinctItemsConstraint(items, lo, hi, tok)
    tokens = _segments(tok, chosen)
    assert tok.decode(tokens) == render(chosen)
    assert Walker(c, tok.eos_token_ids).accepts(tokens)


def test_distinct_items_forbids_repeats_and_bounds(tok: TokenizerInfo) -> None:
    items = ["Alien", "Heat", "Up"]
    c = DistinctItemsConstraint(items, 2, 3, tok)
    eos = tok.eos_token_ids
    assert not Walker(c, eos).accepts(_segments(tok, ["Alien", "Alien"]))
    assert not Walker(c, eos).accepts(_segments(tok, ["Alien"]))  # below min
    assert Walker(c, eos).accepts(_segments(tok, ["Up", "Alien", "Heat"]))
    c1 = DistinctItemsConstraint(items, 1, 1, tok)
    assert not Walker(c1, eos).accepts(_segments(tok, ["Up", "Heat"]))  # above max
    c0 = DistinctItemsConstraint(items, 0, 2, tok)
    assert Walker(c0, eos).accepts(_segments(tok, []))


def test_distinct_items_state_is_per_request(tok: TokenizerInfo) -> None:
    """Two requests sharing one compiled constraint do not see each other's used items."""
    from podium.constraints.engine.batch import ConstraintBatch

    c = DistinctItemsConstraint(["Alien", "Heat"], 2, 2, tok)
    batch = ConstraintBatch(tok.eos_token_ids)
    batch.add_constraint(0, c)
    batch.add_constraint(1, c)
    first = _segments(tok, ["Alien", "Heat"])
    prefix = first[: len(_segments(tok, ["Alien"])) - 1]  # '[', '"Alien"'
    hist = {0: prefix, 1: []}
    slots = np.array([0, 1])

    def fetch(p: np.ndarray, i: np.ndarray) -> np.ndarray:
        return np.array([hist[int(slots[a])][int(b)] for a, b in zip(p, i, strict=True)])

    batch.sync(slots, np.array([len(prefix), 0]), fetch)
    rows, toks = batch.allowed(slots)
    start_1 = set(toks[rows == 1].tolist())
    assert start_1 == set(tok.encode_batch([OPEN])[0][:1])


# --- regex ---

PATTERNS = [r"[A-Z]{2}-[0-9]{4}", r"(yes|no|maybe)", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)",
            r"-?[0-9]{1,6}(\.[0-9]{1,3})?", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"]


@pytest.mark.parametrize("pattern", PATTERNS)
@SETTINGS
@given(rnd=picker)
def test_regex_every_walk_matches(tok: TokenizerInfo, pattern: str, rnd) -> None:
    c = _regex(pattern, tok)
    text = tok.decode(Walker(c, tok.eos_token_ids).sample(rnd.choice, max_tokens=64))
    assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("pattern", PATTERNS)
@SETTINGS
@given(data=st.data())
def test_regex_every_match_is_accepted(tok: TokenizerInfo, pattern: str, data) -> None:
    text = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True))
    assert Walker(_regex(pattern, tok), tok.eos_token_ids).accepts(tok.encode_batch([text])[0])


_REGEX_CACHE: dict[str, RegexConstraint] = {}


def _regex(pattern: str, tok: TokenizerInfo) -> RegexConstraint:
    if pattern not in _REGEX_CACHE:
        _REGEX_CACHE[pattern] = RegexConstraint(pattern, tok)
    return _REGEX_CACHE[pattern]


def test_distinct_items_own_methods_agree_with_the_batch(tok: TokenizerInfo) -> None:
    """Asked directly, a built-in steps its form in the batch kernels, each handle on its own:
    two handles walking different arrays see what a batch slot with that history sees."""
    c = DistinctItemsConstraint(["Alien", "Heat", "Up"], 1, 3, tok)
    eos = set(tok.eos_token_ids)
    walks = [_segments(tok, ["Heat", "Alien"]), _segments(tok, ["Up", "Heat", "Alien"])]
    handles = np.array([0, 1])
    states = c.start(handles)
    for step in range(max(map(len, walks))):
        rows, toks = c.allowed(handles, states)
        accepting = c.is_accepting(handles, states)
        for i, walk in enumerate(walks):
            mine = set(toks[rows == i].tolist())
            own = mine | (eos if accepting[i] or not mine else set())
            w = Walker(c, tok.eos_token_ids)
            w.history = walk[:step] if step <= len(walk) else walk
            assert own == w.allowed(), (i, step)
        picks = np.array([w[step] if step < len(w) else 0 for w in walks])
        states = c.advance(handles, states, picks)
