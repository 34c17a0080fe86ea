"""Requests vLLM itself would refuse (out-of-vocabulary token ids, logprobs over its limit, a
prompt past the context, max_tokens of 2**63-1) are 400 / INVALID_ARGUMENT at once on the real
engine over HTTP generate and gRPC, never a 500 or a generation that runs on; each is followed
by a good request on the same instance."""

from __future__ import annotations

import json
import time

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import API_KEY, EMBEDDER, LLM

pytestmark = pytest.mark.engine

CONTEXT = 8192  # the default package's engine_args max_model_len
HEADERS = {"authorization": f"Bearer {API_KEY}"}
LONG_PROMPT = "hello " * (CONTEXT + 100)

# (prompt, sampling parameters, words the error must contain)
CASES: dict[str, tuple[str, dict, list[str]]] = {
    "stop-token-id-out-of-vocab": ("Hi", {"stop_token_ids": [10**6]}, ["stop_token_ids"]),
    "allowed-token-id-out-of-vocab": ("Hi", {"allowed_token_ids": [10**6]},
                                      ["allowed_token_ids"]),
    "logprobs-21": ("Hi", {"logprobs": 21}, ["logprobs=21", "20"]),
    "prompt-past-context": (LONG_PROMPT, {"max_tokens": 2}, ["prompt", str(CONTEXT)]),
    "max-tokens-int64": ("Hi", {"max_tokens": 2**63 - 1}, [f"max_tokens={2**63 - 1}",
                                                            str(CONTEXT)]),
    # the instance's --max-n (16), as on /v1: not vLLM's 16,384
    "n-over-max-n": ("Hi", {"n": 17}, ["n=17", "cap of 16", "--max-n"]),
    # llguidance unrolled the count in the server's process: 17.7 GB, then the OOM killer
    "structured-outputs-min-items-1e9": (
        "Hi", {"structured_outputs": {"json": {"type": "array", "minItems": 10**9}}},
        ["structured_outputs.json.minItems=1000000000", "context"]),
    "constraint-with-structured-outputs": (
        "Hi", {"structured_outputs": {"json": {"type": "object"}},
               "constraint": {"type": "choice", "choices": ["a"]}},
        ["constraint cannot be combined with structured_outputs"]),
    "structured-outputs-remote-ref": (
        "Hi", {"structured_outputs": {"json": {"$ref": "file:///etc/passwd"}}},
        ["structured_outputs.json.$ref", "outside the schema"]),
}


def _good_generate(base: str) -> None:
    r = httpx.post(f"{base}/v2/models/{LLM}/generate", headers=HEADERS, timeout=60,
                   json={"text_input": "Hello", "parameters": {"max_tokens": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["text_output"]


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_http_generate_refused_then_good(instance, case: str) -> None:
    prompt, params, words = CASES[case]
    started = time.monotonic()
    r = httpx.post(f"{instance.http_url}/v2/models/{LLM}/generate", headers=HEADERS,
                   timeout=30, json={"text_input": prompt, "parameters": params})
    assert r.status_code == 400, r.text
    assert time.monotonic() - started < 10  # refused, not generated
    for word in words:
        assert word in r.json()["error"], r.json()
    _good_generate(instance.http_url)


def _grpc_request(prompt: str, params: dict) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=LLM)
    for name, value in (("text_input", prompt), ("sampling_parameters", json.dumps(params))):
        request.inputs.add(name=name, datatype="BYTES", shape=[1])
        data = value.encode()
        request.raw_input_contents.append(len(data).to_bytes(4, "little") + data)
    return request


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_grpc_model_infer_refused_then_good(instance, case: str) -> None:
    prompt, params, words = CASES[case]
    metadata = tuple(HEADERS.items())
    with grpc.insecure_channel(instance.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(_grpc_request(prompt, params), metadata=metadata, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        for word in words:
            assert word in err.value.details(), err.value.details()
        good = stub.ModelInfer(_grpc_request("Hello", {"max_tokens": 2}), metadata=metadata,
                               timeout=60)
        assert good.raw_output_contents


def test_embedding_past_the_context_is_vllms_400(instance) -> None:
    """No Podium pre-check here: vLLM's own VLLMValidationError comes back as a 400."""
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                        "data": ["word " * 2000]}]}
    r = httpx.post(f"{instance.http_url}/v2/models/{EMBEDDER}/infer", headers=HEADERS,
                   json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "engine rejected" in r.json()["error"], r.json()
    body["inputs"][0]["data"] = ["a short sentence"]
    r = httpx.post(f"{instance.http_url}/v2/models/{EMBEDDER}/infer", headers=HEADERS,
                   json=body, timeout=60)
    assert r.status_code == 200, r.text
