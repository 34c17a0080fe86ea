"""vLLM's own admission control on the shared real instance (`--max-num-queued-tokens`, see
tests/conftest.py): a burst of long prompts past the prefill backlog gets 429s in the OpenAI
shape on /v1 and RESOURCE_EXHAUSTED on gRPC, never a 5xx; `vllm:admission_rejections` counts
them in /metrics; a good request follows. The bound no flag sets (`max_num_queued_reqs`) is
the one measured at boot on this machine, shown by the model's config and logged; a burst past
it is shed with Retry-After; a request whose deadline the engine cannot meet is refused at
once, on /v1 and on gRPC."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import API_KEY, EMBEDDER, LLM, MAX_NUM_QUEUED_TOKENS
from tests.support.polling import eventually

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


def _admission(base: str, model: str) -> dict:
    r = httpx.get(f"{base}/v2/models/{model}/config", headers=HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["admission"]


def test_the_bounds_no_flag_sets_are_measured_on_this_machine(instance) -> None:
    admission = _admission(instance.http_url, LLM)
    # the flag's token bound wins; the request bound is derived from the measured speed
    assert admission["sources"] == {"max_num_queued_reqs": "measured",
                                    "max_num_queued_tokens": "flag"}, admission
    assert admission["max_num_queued_tokens"] == MAX_NUM_QUEUED_TOKENS
    rates = admission["rates"]
    assert rates["prefill_tokens_per_s"] > 0 and rates["decode_tokens_per_s"] > 0, rates
    assert 1 <= admission["max_num_queued_reqs"] < 256  # not the fixed default
    assert admission["target_wait_s"] == 30
    embedder = _admission(instance.http_url, EMBEDDER)  # a pooling model: prefill only
    assert embedder["sources"]["max_num_queued_reqs"] == "measured"
    assert embedder["rates"]["decode_tokens_per_s"] is None
    log = instance.log()
    assert f"admission of {LLM}" in log
    if admission["measured_at"] is None:  # measured during this boot
        assert "probe took" in log
    else:  # the probe's last rates for this package on this machine (`probe_cache`)
        assert f"measured at {admission['measured_at']} on this machine" in log
    assert f"max_num_queued_reqs={admission['max_num_queued_reqs']} (measured)" in log


def test_a_burst_past_the_measured_bound_is_shed_with_retry_after(instance) -> None:
    bound = _admission(instance.http_url, LLM)["max_num_queued_reqs"]
    burst = bound + 4  # each holds its place for 48 tokens: all are in flight at once

    def completion(_: int) -> httpx.Response:
        return httpx.post(f"{instance.http_url}/v1/completions", headers=HEADERS, timeout=300,
                          json={"model": LLM, "prompt": "Count:", "max_tokens": 48,
                                "ignore_eos": True})

    with ThreadPoolExecutor(burst) as pool:
        answers = list(pool.map(completion, range(burst)))
    statuses = [r.status_code for r in answers]
    assert set(statuses) <= {200, 429} and 429 in statuses, statuses
    for r in answers:
        if r.status_code == 429:
            assert r.headers["Retry-After"] == "1"
            assert "max_num_queued_reqs" in r.json()["error"]["message"]
    good = httpx.post(f"{instance.http_url}/v1/completions", headers=HEADERS, timeout=120,
                      json={"model": LLM, "prompt": "Hello", "max_tokens": 2})
    assert good.status_code == 200, good.text


LONG = {"max_tokens": 3000, "ignore_eos": True}
"""3,000 tokens it must produce: minutes on this machine, seconds on any."""


def test_a_request_that_cannot_meet_its_deadline_is_refused_at_once(instance) -> None:
    r = httpx.post(f"{instance.http_url}/v1/completions", timeout=60,
                   headers={**HEADERS, "X-Request-Timeout": "2"},
                   json={"model": LLM, "prompt": "Count:", **LONG})
    assert r.status_code == 429, r.text
    assert int(r.headers["Retry-After"]) >= 1
    error = r.json()["error"]
    assert error["param"] == "X-Request-Timeout" and "deadline" in error["message"], error
    request = service_pb2.ModelInferRequest(model_name=LLM)
    for name, value in (("text_input", "Count:"), ("sampling_parameters", json.dumps(LONG))):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(value.encode())
    with grpc.insecure_channel(instance.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=tuple(HEADERS.items()), timeout=2)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "deadline" in refused.value.details()
    # a good request: one that can finish within its deadline
    good = httpx.post(f"{instance.http_url}/v1/completions", timeout=120,
                      headers={**HEADERS, "X-Request-Timeout": "60"},
                      json={"model": LLM, "prompt": "Hello", "max_tokens": 2})
    assert good.status_code == 200, good.text


NEVER_ENDS = {"prompt": "Count: 1, 2, 3,", "max_tokens": 3000,
              "logit_bias": {"0": -100, "1": -100, "2": -100}}
"""Admitted under any deadline (it may stop early, so only its prompt is counted), yet it
cannot stop: its end-of-text tokens are banned, and 3,000 tokens take minutes here."""


def _running(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "vllm:num_requests_running" for sample in family.samples)


def test_a_request_whose_deadline_passes_while_it_runs_is_aborted_with_504(instance) -> None:
    base = instance.http_url
    r = httpx.post(f"{base}/v1/completions", timeout=120,
                   headers={**HEADERS, "X-Request-Timeout": "2"},
                   json={"model": LLM, **NEVER_ENDS})
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["param"] == "X-Request-Timeout" and error["type"] == "timeout_error", error
    assert eventually(lambda: _running(base) == 0, timeout_s=30)  # aborted in the engine
    # streamed: the 200 went with the first token; the stream's last event is the 504
    with httpx.stream("POST", f"{base}/v1/completions", timeout=120,
                      headers={**HEADERS, "X-Request-Timeout": "2"},
                      json={"model": LLM, **NEVER_ENDS, "stream": True}) as stream:
        assert stream.status_code == 200
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 3, lines[-3:]
    assert json.loads(lines[-2][6:])["error"]["code"] == 504, lines[-3:]
    assert eventually(lambda: _running(base) == 0, timeout_s=30)
    good = httpx.post(f"{base}/v1/completions", timeout=120,
                      headers={**HEADERS, "X-Request-Timeout": "60"},
                      json={"model": LLM, "prompt": "Hello", "max_tokens": 2})
    assert good.status_code == 200, good.text
