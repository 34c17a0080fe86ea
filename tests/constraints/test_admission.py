"""Admission: malformed constraints are rejected with a message and field that name them."""

from __future__ import annotations

import json

import pytest

from podium.constraints.spec.admission import XARGS_KEY, to_vllm_xargs, validate_constraint
from podium.errors import InvalidArgument
from podium.errors.render import kind_of

BAD = [
    pytest.param("choice", "constraint", "must be an object", id="not-an-object"),
    pytest.param({"choices": ["a"]}, "constraint.type", "type is required", id="no-type"),
    pytest.param({"type": "grammar"}, "constraint.type", "unknown constraint type 'grammar'",
                 id="unknown-type"),
    pytest.param({"type": "choice", "choices": []}, "constraint.choices", "is empty",
                 id="choice-empty"),
    pytest.param({"type": "choice", "choices": "abc"}, "constraint.choices",
                 "must be a list of strings", id="choice-not-list"),
    pytest.param({"type": "choice", "choices": ["a", 3]}, "constraint.choices[1]",
                 "must be a string", id="choice-not-string"),
    pytest.param({"type": "choice", "choices": ["a", ""]}, "constraint.choices[1]",
                 "empty string", id="choice-empty-string"),
    pytest.param({"type": "choice", "choices": ["ok", "a\x16b"]}, "constraint.choices[1]",
                 "control character U+0016", id="choice-control-character"),
    pytest.param({"type": "choice", "choices": ["a"], "extra": 1}, "constraint.extra",
                 "unknown field 'extra'", id="choice-unknown-field"),
    pytest.param({"type": "distinct_items", "items": []}, "constraint.items", "is empty",
                 id="distinct-empty"),
    pytest.param({"type": "distinct_items", "items": ["a", "b"], "min": 2, "max": 1},
                 "constraint.min", "min=2 is greater than max=1", id="distinct-min-gt-max"),
    pytest.param({"type": "distinct_items", "items": ["a", "b"], "min": 3},
                 "constraint.min", "min=3 exceeds the 2 distinct items", id="distinct-min-gt-n"),
    pytest.param({"type": "distinct_items", "items": ["a"], "min": "1"}, "constraint.min",
                 "must be an integer", id="distinct-min-not-int"),
    pytest.param({"type": "distinct_items", "items": ["a"], "max": -1}, "constraint.max",
                 "is negative", id="distinct-negative"),
    pytest.param({"type": "regex", "pattern": "[a-"}, "constraint.pattern", "invalid regex",
                 id="regex-invalid"),
    pytest.param({"type": "regex", "pattern": r"(a)\1"}, "constraint.pattern",
                 "cannot be compiled to a DFA", id="regex-backreference"),
    pytest.param({"type": "regex"}, "constraint.pattern", "non-empty string", id="regex-missing"),
]


@pytest.mark.parametrize(("spec", "param", "message"), BAD)
def test_bad_constraint_is_rejected_naming_the_problem(spec: object, param: str,
                                                       message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        validate_constraint(spec)
    assert e.value.param == param
    assert message in e.value.message
    assert kind_of(e.value).http_status == 400


def test_valid_specs_are_normalized() -> None:
    assert validate_constraint({"type": "choice", "choices": ["b", "a", "b"]}) == {
        "type": "choice", "choices": ["b", "a"]}
    assert validate_constraint({"type": "distinct_items", "items": ["x", "y", "z"]}) == {
        "type": "distinct_items", "items": ["x", "y", "z"], "min": 1, "max": 3}
    # max beyond the candidate count is the same constraint as max = count
    assert validate_constraint(
        {"type": "distinct_items", "items": ["x", "y"], "min": 0, "max": 9})["max"] == 2
    assert validate_constraint({"type": "regex", "pattern": "[0-9]+"}) == {
        "type": "regex", "pattern": "[0-9]+"}


def test_xargs_round_trip() -> None:
    spec = validate_constraint({"type": "choice", "choices": ["Amélie", "Heat"]})
    xargs = to_vllm_xargs(spec)
    assert list(xargs) == [XARGS_KEY]
    assert json.loads(xargs[XARGS_KEY]) == spec


def test_min_tokens_cannot_combine_with_a_constraint() -> None:
    from podium.constraints import check_sampling

    with pytest.raises(InvalidArgument) as err:
        check_sampling(min_tokens=3)
    assert err.value.param == "min_tokens"
    check_sampling(min_tokens=0)
    check_sampling(min_tokens=None)


def test_admission_adds_the_constraint_to_the_requests_own_extra_arguments() -> None:
    from podium.constraints import admit_constraint

    spec = {"type": "choice", "choices": ["yes", "no"]}
    xargs = admit_constraint(spec, xargs={"other_processor": "1"})
    assert xargs["other_processor"] == "1"
    assert json.loads(xargs[XARGS_KEY])["choices"] == ["yes", "no"]
    with pytest.raises(InvalidArgument) as err:
        admit_constraint(spec, xargs=["not", "an", "object"], xargs_field="extra_args")
    assert err.value.param == "extra_args" and "must be an object, got list" in err.value.message
    with pytest.raises(InvalidArgument) as err:
        admit_constraint(spec, min_tokens=2)
    assert err.value.param == "min_tokens"
    assert XARGS_KEY in admit_constraint(spec, min_tokens=0)


@pytest.mark.parametrize("field", ["response_format json_object", "structured_outputs"])
def test_a_constraint_beside_a_grammar_is_refused(field: str) -> None:
    from podium.constraints import admit_constraint

    spec = {"type": "choice", "choices": ["a"]}
    with pytest.raises(InvalidArgument) as e:
        admit_constraint(spec, also_constrained_by=field)
    assert e.value.param == "constraint"
    assert f"cannot be combined with {field}" in e.value.message
    assert admit_constraint(spec)["podium_constraint"]  # alone: admitted
