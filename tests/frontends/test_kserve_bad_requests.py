"""Every malformed KServe request (HTTP JSON, binary extension, gRPC) is a 4xx naming the field,
before any backend runs, and the same server then answers a good request."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import httpx
import pytest

from podium.examples.builders import synthetic_features
from tests.support.kserve_instance import EMBEDDER, LIMITS, LLM, Instance, MiB

ROW = synthetic_features(1, seed=1).ravel().tolist()
XGB = "/v2/models/xgb-example/infer"
GENERATE = f"/v2/models/{LLM}/generate"
INT64_MAX = 2**63 - 1
Body = dict[str, Any] | tuple[bytes, dict[str, Any]]


def features(**fields: Any) -> dict[str, Any]:
    """An xgb-example infer body whose one input has `fields` replaced."""
    tensor = {"name": "features", "datatype": "FP32", "shape": [1, 20], "data": ROW, **fields}
    return {"inputs": [{k: v for k, v in tensor.items() if v is not ...}]}


def llm_infer(text: Any = "Capital?", sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    inputs = [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [text]}]
    if sampling is not None:
        inputs.append({"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
                       "data": [json.dumps(sampling)]})
    return {"inputs": inputs}


def generate(**parameters: Any) -> dict[str, Any]:
    return {"text_input": "Capital?", "parameters": parameters}


def binary(header: dict[str, Any], raw: bytes, length: str | None = None) -> Body:
    text = json.dumps(header).encode()
    return text + raw, {"Inference-Header-Content-Length": (length or str(len(text)))
                        .encode("latin-1"), "Content-Type": "application/octet-stream"}


def bytes_element(value: bytes) -> bytes:
    return len(value).to_bytes(4, "little") + value


def compressed(encoding: str, data: bytes) -> Body:
    packed = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    return packed, {"Content-Encoding": encoding, "Content-Type": "application/json"}


def as_json(body: dict[str, Any]) -> Body:
    """`body` as ASCII JSON: escapes carry what UTF-8 cannot (lone surrogates)."""
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def deep(depth: int, route_body: str = '{"inputs": %s}') -> Body:
    return (route_body % ("[" * depth + "]" * depth)).encode(), {}


BOMB = b'{"inputs": [], "id": "' + b"0" * (8 * MiB) + b'"}'  # 8 MiB inflated, ~8 KiB sent
BYTES_TEXT = {"name": "text_input", "datatype": "BYTES", "shape": [1]}

# (path, body, status, words the error must contain)
HTTP_CASES: dict[str, tuple[str, Body, int, list[str]]] = {
    # shapes
    "negative-dim": (XGB, features(shape=[-1, 20]), 400, ["shape[0]", "greater than or equal"]),
    "bool-dim": (XGB, features(shape=[True, 20]), 400, ["('features').shape[0]", "integer"]),
    "float-dim": (XGB, features(shape=[1.0, 20]), 400, ["shape[0]", "integer", "1.0"]),
    "string-dim": (XGB, features(shape=["1", 20]), 400, ["shape[0]", "'1'"]),
    "shape-not-a-list": (XGB, features(shape="1,20"), 400, ["shape", "valid list"]),
    "shape-2**32-x-2**32": (XGB, features(shape=[2**32, 2**32], data=[]), 413,
                            ["18446744073709551616 elements", "--max-elements"]),
    "shape-2**64": (XGB, features(shape=[2**64], data=[]), 413, ["--max-elements"]),
    "too-many-elements": (XGB, features(shape=[1000, 1001], data=[]), 413,
                          ["1001000 elements", "1000000", "--max-elements"]),
    "shape-vs-data": (XGB, features(data=ROW[:19]), 400, ["'features'", "20 elements", "19"]),
    "data-past-shape": (XGB, features(shape=[1, 2], data=ROW), 400,
                        ["'features'", "2 elements", "more than 2"]),
    # datatypes and data values
    "unknown-datatype": (XGB, features(datatype="FP8"), 400, ["datatype", "'FP32'", "'FP8'"]),
    "datatype-as-list": (XGB, features(datatype=["FP32"]), 400, ["('features').datatype"]),
    "fp32-data-holds-a-string": (XGB, features(data=["x"] * 20), 400,
                                 ["'features'", "FP32 data must be numbers"]),
    "fp32-data-holds-a-bool": (XGB, features(data=[True] * 20), 400, ["a boolean"]),
    "fp32-data-holds-an-object": (XGB, features(data=[{"a": 1}] * 20), 400, ["an object"]),
    "bytes-data-holds-a-number": (f"/v2/models/{LLM}/infer", llm_infer(text=2**40), 400,
                                  ["'text_input'", "BYTES data must be strings"]),
    # fields of the wrong JSON type, or unknown
    "parameters-as-list": (XGB, {**features(), "parameters": ["a"]}, 400, ["parameters"]),
    "parameter-value-object": (XGB, {**features(), "parameters": {"x": {"a": 1}}}, 400,
                               ["parameters.x"]),
    "input-parameters-as-list": (XGB, features(parameters=[1]), 400,
                                 ["('features').parameters"]),
    "inputs-not-a-list": (XGB, {"inputs": {"name": "features"}}, 400, ["inputs", "list"]),
    "input-not-an-object": (XGB, {"inputs": ["features"]}, 400, ["inputs[0]"]),
    "name-not-a-string": (XGB, features(name=5), 400, ["inputs[0].name", "string"]),
    "unknown-input-field": (XGB, features(dtype="FP32"), 400, ["dtype", "unknown field"]),
    "unknown-top-level-field": (XGB, {**features(), "input": []}, 400, ["input", "unknown"]),
    "id-not-a-string": (XGB, {**features(), "id": ["a"]}, 400, ["id", "string"]),
    "outputs-entry-no-name": (XGB, {**features(), "outputs": [{}]}, 400, ["outputs[0].name"]),
    "binary-data-flag-not-bool": (XGB, {**features(), "outputs": [
        {"name": "probability", "parameters": {"binary_data": "yes"}}]}, 400,
        ["binary_data='yes'"]),
    # binary extension
    "data-and-binary-size": (XGB, features(parameters={"binary_data_size": 80}), 400,
                             ["both 'data' and", "binary_data_size"]),
    "binary-size-negative": (XGB, binary(features(data=..., parameters={
        "binary_data_size": -1}), b""), 400, ["binary_data_size=-1"]),
    "binary-size-bool": (XGB, binary(features(data=..., parameters={
        "binary_data_size": True}), b""), 400, ["binary_data_size=True"]),
    "binary-size-past-body": (XGB, binary(features(data=..., parameters={
        "binary_data_size": 4000}), b"\0" * 80), 400, ["binary_data_size=4000", "80 binary"]),
    "header-length-past-body": (XGB, binary(features(), b"", length="99999"), 400,
                                ["Inference-Header-Content-Length=99999", "past the end"]),
    "header-length-negative": (XGB, binary(features(), b"", length="-5"), 400,
                               ["Inference-Header-Content-Length='-5'"]),
    "header-length-not-a-number": (XGB, binary(features(), b"", length="ten"), 400,
                                   ["Inference-Header-Content-Length='ten'"]),
    "header-length-superscript": (XGB, binary(features(), b"", length="\u00b2"), 400,
                                  ["Inference-Header-Content-Length='\u00b2'"]),
    # bodies: size, compression, depth, text
    "body-over-limit": (XGB, (b" " * (LIMITS.max_body_bytes + 1), {}), 413,
                        ["2097152-byte limit", "--max-body-bytes"]),
    "gzip-bomb": (XGB, compressed("gzip", BOMB), 413, ["4194304-byte", "--max-inflated-bytes"]),
    "deflate-bomb": (XGB, compressed("deflate", BOMB), 413, ["deflate", "--max-inflated-bytes"]),
    "gzip-bomb-on-generate": (GENERATE, compressed("gzip", BOMB), 413,
                              ["--max-inflated-bytes"]),
    "headers-over-limit": (XGB, (json.dumps(features()).encode(), {"X-Big": "a" * 20_000}),
                           431, ["the instance's limit of 16384 bytes",
                                 "--max-header-bytes", "bytes came"]),
    "not-gzip": (XGB, (b"plain", {"Content-Encoding": "gzip"}), 400, ["not valid gzip"]),
    "unknown-encoding": (XGB, (b"{}", {"Content-Encoding": "br"}), 400, ["'br'", "gzip"]),
    "100k-deep-json-infer": (XGB, deep(100_000), 400, ["deeper", "--max-json-depth"]),
    "100k-deep-json-generate": (GENERATE, deep(100_000, '{"text_input": %s}'), 400,
                                ["deeper", "--max-json-depth"]),
    "json-past-depth-limit": (XGB, deep(70), 400, ["depth 65", "64-level", "--max-json-depth"]),
    "invalid-utf8-json": (f"/v2/models/{LLM}/infer", (json.dumps(llm_infer("X")).encode()
                                                      .replace(b"X", b"\xff\xfe"), {}), 400,
                          ["not valid JSON", "utf-8"]),
    "lone-surrogate-infer": (f"/v2/models/{LLM}/infer", as_json(llm_infer("\ud800")), 400,
                             ["surrogate", "\\ud800", "body.inputs[0].data[0]"]),
    "lone-surrogate-generate": (GENERATE, as_json({"text_input": "a\udc00b"}), 400,
                                ["surrogate", "body.text_input"]),
    "invalid-utf8-binary-llm": (f"/v2/models/{LLM}/infer", binary(
        {"inputs": [{**BYTES_TEXT, "parameters": {"binary_data_size": 6}}]},
        bytes_element(b"\xff\xfe")), 400, ["'text_input' is not UTF-8"]),
    "invalid-utf8-binary-candidates": (f"/v2/models/{LLM}/infer", binary({"inputs": [
        {"name": "context", "datatype": "BYTES", "shape": [1], "data": ["Paris is"]},
        {"name": "candidates", "datatype": "BYTES", "shape": [1],
         "parameters": {"binary_data_size": 5}}]}, bytes_element(b"\xc3")), 400,
        ["'candidates' is not UTF-8"]),
    "invalid-utf8-binary-embedder": (f"/v2/models/{EMBEDDER}/infer", binary(
        {"inputs": [{**BYTES_TEXT, "parameters": {"binary_data_size": 5}}]},
        bytes_element(b"\x80")), 400, ["'text_input' is not UTF-8"]),
    # counts
    "too-many-inputs": (XGB, {"inputs": [{**features()["inputs"][0], "name": f"f{i}"}
                                         for i in range(17)]}, 413,
                        ["17 tensors", "--max-tensors"]),
    "too-many-outputs": (XGB, {**features(), "outputs": [{"name": f"o{i}"} for i in range(17)]},
                         413, ["'outputs'", "--max-tensors"]),
    # LLM generation: max_tokens and the model's limits
    "max-tokens-int64-generate": (GENERATE, generate(max_tokens=INT64_MAX), 400,
                                  [f"max_tokens={INT64_MAX}", "context of 64", "prompt uses 2"]),
    "max-tokens-int64-stream": (f"/v2/models/{LLM}/generate_stream",
                                generate(max_tokens=INT64_MAX), 400, ["max_tokens="]),
    "max-tokens-int64-infer": (f"/v2/models/{LLM}/infer", llm_infer(sampling={
        "max_tokens": INT64_MAX}), 400, [f"max_tokens={INT64_MAX}", "context of 64"]),
    "max-tokens-2**64": (GENERATE, generate(max_tokens=2**64), 400, ["max_tokens", "64-bit"]),
    "max-tokens-zero": (GENERATE, generate(max_tokens=0), 400, ["max_tokens=0", "at least 1"]),
    "max-tokens-negative": (GENERATE, generate(max_tokens=-3), 400, ["max_tokens=-3"]),
    "max-tokens-ten": (GENERATE, generate(max_tokens="ten"), 400, ["max_tokens='ten'",
                                                                    "an integer"]),
    "max-tokens-past-prompt": (GENERATE, {"text_input": "a b c", "parameters": {
        "max_tokens": 61}}, 400, ["max_tokens=61", "prompt uses 4", "at most 60"]),
    "prompt-past-context": (GENERATE, {"text_input": "w " * 70}, 400,
                            ["71 tokens", "context of 64", "text_input"]),
    "stop-token-id-out-of-vocab": (GENERATE, generate(stop_token_ids=[5000]), 400,
                                   ["stop_token_ids", "5000", "0 to 999"]),
    "allowed-token-id-out-of-vocab": (GENERATE, generate(allowed_token_ids=[1, -1]), 400,
                                      ["allowed_token_ids", "-1"]),
    "logprobs-21": (GENERATE, generate(logprobs=21), 400, ["logprobs=21", "limit of 20"]),
    "n-too-many": (GENERATE, generate(n=10_000), 400, ["n=10000"]),
    "stop-not-strings": (GENERATE, generate(stop=[1]), 400, ["stop=[1]", "a string", "got `int`"]),
    "one-stop-string-too-long": (GENERATE, generate(stop="x" * 2000), 400,
                                 ["stop holds a string of 2000 characters", "1024",
                                  "--max-stop-chars"]),
    "score-past-context": (f"/v2/models/{LLM}/score", {"context": "w " * 60,
                                                       "candidates": ["a b c d e"]}, 400,
                           ["context (61 tokens)", "longest candidate (5)", "context of 64"]),
    "score-too-many-candidates": (f"/v2/models/{LLM}/score", {"context": "Paris",
                                                              "candidates": ["x"] * 257}, 400,
                                  ["257 candidates", "256"]),
    "load-parameters-as-list": ("/v2/repository/models/xgb-example/load",
                                {"parameters": ["version_policy"]}, 400, ["parameters",
                                                                          "dictionary"]),
    "unload-parameters-as-list": ("/v2/repository/models/nope/unload",
                                  {"parameters": [["a"]]}, 400, ["parameters"]),
    # advertised and ignored before: there are no dependents to unload
    "unload-dependents-true": ("/v2/repository/models/xgb-example/unload",
                               {"parameters": {"unload_dependents": True}}, 400,
                               ["unload_dependents=true", "no dependents"]),
    "unload-dependents-not-bool": ("/v2/repository/models/xgb-example/unload",
                                   {"parameters": {"unload_dependents": "maybe"}}, 400,
                                   ["unload_dependents='maybe' must be true or false"]),
    "index-ready-not-bool": ("/v2/repository/index", {"ready": "yes"}, 400, ["ready"]),
    "deep-json-inside-sampling-parameters": (f"/v2/models/{LLM}/infer", {"inputs": [
        {**BYTES_TEXT, "data": ["hi"]}, {"name": "sampling_parameters", "datatype": "BYTES",
                                         "shape": [1], "data": ["[" * 100_000]}]}, 400,
        ["sampling_parameters nests too deeply"]),
    "deep-constraint-text": (GENERATE, generate(constraint='{"a":' * 50_000), 400,
                             ["nests too deeply"]),
    "load-config-too-deep": ("/v2/repository/models/xgb-example/load", {"parameters": {
        "config": "[" * 100_000}}, 400, ["load parameter 'config' nests JSON deeper"]),
    "surrogate-in-sampling-json-text": (f"/v2/models/{LLM}/infer", {"inputs": [
        {**BYTES_TEXT, "data": ["hi"]}, {"name": "sampling_parameters", "datatype": "BYTES",
                                         "shape": [1], "data": ['{"stop": ["\\ud800"]}']}]},
        400, ["stop holds a lone UTF-16 surrogate"]),
    "generate-parameters-as-list": (GENERATE, {"text_input": "x", "parameters": [1]}, 400,
                                    ["'parameters' must be an object"]),
}


def _good(kserve_instance: Instance) -> None:
    reply = httpx.post(f"http://{kserve_instance.http_url}{XGB}", json=features(), timeout=10)
    assert reply.status_code == 200, reply.text
    reply = httpx.post(f"http://{kserve_instance.http_url}{GENERATE}",
                       json={"text_input": "Capital?", "parameters": {"max_tokens": 2}},
                       timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["text_output"].endswith("Paris is")


@pytest.mark.parametrize("case", list(HTTP_CASES), ids=list(HTTP_CASES))
def test_http_bad_request_then_good(kserve_instance: Instance, case: str) -> None:
    path, body, status, words = HTTP_CASES[case]
    url = f"http://{kserve_instance.http_url}{path}"
    if isinstance(body, tuple):
        reply = httpx.post(url, content=body[0], headers=body[1], timeout=30)
    else:
        reply = httpx.post(url, json=body, timeout=30)
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]
    for word in words:
        assert word in message, message
    _good(kserve_instance)


def test_one_stop_string_is_one_stop(kserve_instance: Instance) -> None:
    """`stop` as one string (SamplingParams takes `str | list[str]`) counts as one stop, not
    as a list of its characters."""
    reply = httpx.post(f"http://{kserve_instance.http_url}{GENERATE}",
                       json=generate(stop="x" * 100, max_tokens=2), timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.json()["text_output"].endswith("Paris is")
