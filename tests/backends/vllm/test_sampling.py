"""Sampling parameters as Triton clients send them, coerced to the types vLLM declares."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
import pytest

from podium.backends.base import InferenceRequest, Tensor
from podium.backends.vllm import sampling as vllm_sampling
from podium.errors import InvalidArgument


def text(name: str, *values: str) -> Tensor:
    data = np.empty(len(values), dtype=object)
    data[:] = [v.encode() for v in values]
    return Tensor(name, "BYTES", data)


def request(*tensors: Tensor, **parameters: object) -> InferenceRequest:
    return InferenceRequest({t.name: t for t in tensors}, id="req", parameters=dict(parameters))


def parse(sampling: dict[str, Any], **parameters: object) -> dict[str, Any]:
    return vllm_sampling.parse_sampling_parameters(
        request(text("sampling_parameters", json.dumps(sampling)), **parameters))


def test_sampling_parameters_convert_like_triton() -> None:
    parsed = parse({"temperature": "0.5", "max_tokens": "7", "ignore_eos": "true",
                    "stop": "###", "top_k": 3, "stop_token_ids": "[1, 2]"}, seed=4)
    assert parsed == {"temperature": 0.5, "max_tokens": 7, "ignore_eos": True, "stop": "###",
                      "top_k": 3, "stop_token_ids": [1, 2], "seed": 4}


@pytest.mark.parametrize(("field", "sent", "expected"), [
    ("temperature", "0.7", 0.7),
    ("temperature", 1, 1.0),
    ("top_k", "5", 5),
    ("top_p", "0.9", 0.9),
    ("seed", "42", 42),
    ("seed", None, None),
    ("logprobs", "2", 2),
    ("max_tokens", 8.0, 8),
    ("ignore_eos", "false", False),
    ("stop", '["x"]', '["x"]'),
    ("stop", ["a", "b"], ["a", "b"]),
    ("stop", "END", "END"),
    ("stop_token_ids", "[7, 8]", [7, 8]),
    ("bad_words", '["darn"]', ["darn"]),
    ("logit_bias", '{"5": -100}', {5: -100.0}),
    ("thinking_token_budget", "64", 64),
], ids=["float-from-text", "float-from-int", "int-from-text", "top-p", "seed", "seed-null",
        "logprobs", "int-from-whole-float", "bool-from-text", "str-or-list-keeps-json-like-str",
        "list", "str-or-list-keeps-str", "int-list-from-json-text", "bad-words",
        "dict-with-int-keys-from-json-text", "field-not-in-any-hand-table"])
def test_a_field_of_vllms_sampling_params_coerces_to_its_type(field: str, sent: Any,
                                                              expected: Any) -> None:
    assert parse({field: sent}) == {field: expected}
    assert vllm_sampling.parse_sampling_parameters(request(**{field: sent})) == {
        field: expected}  # a request parameter converts the same way


def test_coerced_parameters_build_vllms_sampling_params() -> None:
    from vllm import SamplingParams

    parsed = parse({"temperature": "0.2", "top_k": "4", "stop": "x", "seed": "1",
                    "logit_bias": '{"3": 1.5}', "ignore_eos": "true", "n": "2"})
    params = SamplingParams(**parsed)
    assert (params.temperature, params.top_k, params.stop, params.seed, params.n) == (
        0.2, 4, ["x"], 1, 2)
    assert params.logit_bias == {3: 1.5} and params.ignore_eos is True


@pytest.mark.parametrize(("tensor", "parameters", "words"), [
    ('{"max_tokens": 4', {}, ["sampling_parameters is not valid JSON"]),
    ('["max_tokens"]', {}, ["must be a JSON object"]),
    ('{"temperatur": 1}', {}, ["'temperatur'", "not a sampling parameter", "known:",
                               "temperature"]),
    ('{"max_tokens": "many"}', {}, ["max_tokens='many'", "an integer"]),
    ('{"max_tokens": 1.5}', {}, ["max_tokens=1.5", "an integer"]),
    ('{"ignore_eos": "maybe"}', {}, ["ignore_eos='maybe'", "true or false"]),
    ('{"stop_token_ids": "[1,"}', {}, ["stop_token_ids='[1,'", "a list"]),
    ('{"temperature": [1]}', {}, ["temperature=[1]", "a number"]),
    ('{"stop_token_ids": "[1, \\"x\\"]"}', {},
     ["stop_token_ids=\'[1, \"x\"]\'", "a list", "$[1]"]),
    ("{}", {"priority": 1}, ["'priority'", "not a sampling parameter"]),
    ('{"extra_args": {}}', {}, ["'extra_args' is set by Podium", "'constraint'"]),
    ('{"output_kind": 1}', {}, ["'output_kind' is set by Podium"]),
    ('{"detokenize": false}', {}, ["'detokenize' is set by Podium"]),
], ids=["truncated-json", "not-object", "unknown-field", "bad-int", "fractional-int",
        "bad-bool", "bad-list-json", "list-for-number", "bad-list-element",
        "unknown-request-parameter",
        "podium-owned-extra-args", "podium-owned-output-kind", "podium-owned-detokenize"])
def test_bad_sampling_parameters_name_the_field(tensor: str, parameters: dict,
                                                words: list[str]) -> None:
    with pytest.raises(InvalidArgument) as err:
        vllm_sampling.parse_sampling_parameters(request(text("sampling_parameters", tensor),
                                                        **parameters))
    for word in words:
        assert word in err.value.message
    assert vllm_sampling.parse_sampling_parameters(request(max_tokens="2")) == {
        "max_tokens": 2}  # the next good request still parses


def test_podium_owned_fields_are_vllm_fields_not_offered_to_clients() -> None:
    from vllm.sampling_params import SamplingParams

    vllm_fields = {f.name for f in msgspec.structs.fields(SamplingParams)}
    assert set(vllm_sampling.PODIUM_OWNED) <= vllm_fields  # the list names real fields
    offered = set(vllm_sampling.sampling_field_types())
    assert not offered & set(vllm_sampling.PODIUM_OWNED)
    assert {"temperature", "top_k", "stop", "seed", "logprobs", "n"} <= offered


def test_vllm_rejecting_a_value_is_the_clients_error() -> None:
    with pytest.raises(InvalidArgument, match=r"sampling_parameters: .*temperature"):
        vllm_sampling.build_sampling_params(vllm_sampling.vllm_sampling_params,
                                            parse({"temperature": "-1"}))


def test_constraint_rides_in_request_parameters_too() -> None:
    # /generate's "parameters" (an object on HTTP; JSON text where only scalars travel, gRPC)
    constraint = {"type": "choice", "choices": ["yes", "no"]}
    for value in (constraint, json.dumps(constraint)):
        parsed = vllm_sampling.parse_sampling_parameters(request(max_tokens=3,
                                                                 constraint=value))
        assert parsed["max_tokens"] == 3
        assert json.loads(parsed["extra_args"]["podium_constraint"])["choices"] == ["yes", "no"]
    with pytest.raises(InvalidArgument, match="constraint is not valid JSON"):
        vllm_sampling.parse_sampling_parameters(request(constraint="{choice"))
    with pytest.raises(InvalidArgument, match="choices is empty"):
        vllm_sampling.parse_sampling_parameters(request(constraint={"type": "choice",
                                                                    "choices": []}))
    with pytest.raises(InvalidArgument, match="min_tokens cannot be combined"):
        parse({"min_tokens": "2", "constraint": constraint})
