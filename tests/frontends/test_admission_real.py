"""vLLM's own admission control on the shared real instance (`--max-num-queued-tokens`, see
tests/conftest.py): a burst of long prompts past the prefill backlog gets 429s in the OpenAI
shape on /v1 and RESOURCE_EXHAUSTED on gRPC, never a 5xx; `vllm:admission_rejections` counts
them in /metrics; a good request follows."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import API_KEY, LLM, MAX_NUM_QUEUED_TOKENS

pytestmark = pytest.mark.engine

HEADERS = {"authorization": f"Bearer {API_KEY}"}
PROMPT = "hello " * (MAX_NUM_QUEUED_TOKENS // 3 + 200)
"""Three of these in prefill at once pass the backlog limit: the fourth is refused."""
BURST = 16


def _rejections(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "vllm:admission_rejections" for sample in family.samples
               if sample.name.endswith("_total")
               and sample.labels.get("reason") == "max_num_queued_tokens")


def _completion(base: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", headers=HEADERS, timeout=300,
                      json={"model": LLM, "prompt": PROMPT, "max_tokens": 1})


def _grpc_infer(target: str) -> grpc.StatusCode:
    request = service_pb2.ModelInferRequest(model_name=LLM)
    for name, value in (("text_input", PROMPT), ("sampling_parameters",
                                                  json.dumps({"max_tokens": 1}))):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(value.encode())
    with grpc.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(request, metadata=tuple(HEADERS.items()), timeout=300)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert "max_num_queued_tokens" in err.details(), err.details()
                assert ("retry-after", "1") in tuple(err.trailing_metadata())
            return err.code()
    return grpc.StatusCode.OK


def test_a_prefill_backlog_is_refused_with_429_and_resource_exhausted(instance) -> None:
    before = _rejections(instance.http_url)
    with ThreadPoolExecutor(BURST) as pool:
        answers = list(pool.map(lambda _: _completion(instance.http_url), range(BURST)))
    statuses = [r.status_code for r in answers]
    assert set(statuses) <= {200, 429} and 429 in statuses and 200 in statuses, statuses
    for r in answers:
        if r.status_code == 429:
            assert r.headers["Retry-After"] == "1"
            error = r.json()["error"]
            assert error["type"] == "rate_limit_error", error
            assert "max_num_queued_tokens" in error["message"], error
    with ThreadPoolExecutor(BURST) as pool:
        codes = list(pool.map(lambda _: _grpc_infer(instance.grpc_url), range(BURST)))
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
    refused = statuses.count(429) + codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert _rejections(instance.http_url) - before >= refused
    good = httpx.post(f"{instance.http_url}/v1/completions", headers=HEADERS, timeout=120,
                      json={"model": LLM, "prompt": "Hello", "max_tokens": 2})
    assert good.status_code == 200, good.text
