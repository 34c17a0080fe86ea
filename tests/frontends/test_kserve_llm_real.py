"""The LLM over KServe v2 on the real engine, with the real tritonclient (HTTP and gRPC),
the generate extension and prefill-only scoring; the API key guards gRPC as it does HTTP."""

from __future__ import annotations

import json
import math
import queue

import httpx
import numpy as np
import pytest

from tests.conftest import API_KEY, LLM

pytestmark = pytest.mark.engine


def auth() -> dict[str, str]:
    """A fresh dict each call: tritonclient adds its own headers to the one it is given."""
    return {"authorization": f"Bearer {API_KEY}"}  # gRPC metadata keys are lowercase


def _llm_inputs(module, prompt: str, params: dict, stream: bool = False) -> list:
    text = module.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    sampling = module.InferInput("sampling_parameters", [1], "BYTES")
    sampling.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=object))
    flag = module.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    exclude = module.InferInput("exclude_input_in_output", [1], "BOOL")
    exclude.set_data_from_numpy(np.array([True]))
    return [text, sampling, flag, exclude]


def test_llm_infer_over_http_tritonclient(instance) -> None:
    import tritonclient.http as http

    client = http.InferenceServerClient(instance.http_url.removeprefix("http://"))
    assert client.is_model_ready(LLM, headers=auth())
    result = client.infer(LLM, _llm_inputs(http, "The capital of France is",
                                           {"max_tokens": 6, "temperature": 0}), headers=auth())
    text = result.as_numpy("text_output")[0].decode()
    assert text and not text.startswith("The capital")


def test_llm_streams_over_grpc_with_final_flag(instance) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(instance.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)),
                        headers=auth())
    client.async_stream_infer(LLM, _llm_inputs(grpcclient, "Count: 1, 2,",
                                               {"max_tokens": 8, "temperature": 0}, True),
                              request_id="s1", enable_empty_final_response=True)
    parts, final = [], False
    while not final:
        result, error = responses.get(timeout=120)
        assert error is None, error
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        output = result.as_numpy("text_output")
        if output is not None:
            parts.append(output[0].decode())
    client.stop_stream()
    assert len(parts) >= 2 and "".join(parts)


def test_grpc_requires_the_api_key_but_liveness(instance) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(instance.grpc_url)
    assert client.is_server_live()
    with pytest.raises(InferenceServerException, match="API key"):
        client.is_model_ready(LLM)
    with pytest.raises(InferenceServerException, match="API key"):
        client.is_model_ready(LLM, headers={"authorization": "Bearer nope"})
    assert client.is_model_ready(LLM, headers=auth())


def test_generate_and_generate_stream(instance) -> None:
    base = f"{instance.http_url}/v2/models/{LLM}"
    body = {"text_input": "Hello", "parameters": {"max_tokens": 5, "temperature": 0}}
    r = httpx.post(f"{base}/generate", json=body, headers=auth(), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model_name"] == LLM and r.json()["text_output"]
    with httpx.stream("POST", f"{base}/generate_stream", json=body, headers=auth(),
                      timeout=60) as s:
        events = [line for line in s.iter_lines() if line.startswith("data:")]
    assert len(events) >= 2


def test_prefill_scoring_ranks_the_likely_continuation(instance) -> None:
    body = {"context": "The capital of France is",
            "candidates": [" Paris.", " a banana.", " Paris, the city of light."]}
    r = httpx.post(f"{instance.http_url}/v2/models/{LLM}/score", json=body, headers=auth(),
                   timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    sums, rows = data["logprob_sum"], data["token_logprobs"]
    assert len(sums) == 3 and all(s < 0 for s in sums)
    for total, row in zip(sums, rows, strict=True):
        assert math.isclose(total, sum(row), rel_tol=1e-4, abs_tol=1e-4)
    assert sums[0] > sums[1], "' Paris.' must beat ' a banana.'"


def test_malformed_sampling_parameters_then_good(instance) -> None:
    base = f"{instance.http_url}/v2/models/{LLM}/infer"
    bad = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]},
                      {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
                       "data": ["{not json"]}]}
    r = httpx.post(base, json=bad, headers=auth(), timeout=60)
    assert r.status_code == 400 and "sampling_parameters" in r.json()["error"]
    good = {"inputs": [bad["inputs"][0], {"name": "sampling_parameters", "datatype": "BYTES",
                                          "shape": [1], "data": ['{"max_tokens": 2}']}]}
    r = httpx.post(base, json=good, headers=auth(), timeout=60)
    assert r.status_code == 200, r.text


def test_constraint_inside_sampling_parameters(instance) -> None:
    import tritonclient.http as http

    client = http.InferenceServerClient(instance.http_url.removeprefix("http://"))
    params = {"max_tokens": 16, "temperature": 1.0,
              "constraint": {"type": "regex", "pattern": "[A-Z]{3}-[0-9]{4}"}}
    result = client.infer(LLM, _llm_inputs(http, "A product code:", params), headers=auth())
    import re

    assert re.fullmatch("[A-Z]{3}-[0-9]{4}", result.as_numpy("text_output")[0].decode())
    # the time this request waited for its constraint's compiled form, as over OpenAI
    compiled = result.get_response()["parameters"]["constraint_compile_seconds"]
    assert isinstance(compiled, float) and 0 <= compiled < 60
    r = httpx.post(f"{instance.http_url}/v2/models/{LLM}/generate", headers=auth(), timeout=60,
                   json={"text_input": "A product code:", "parameters": {
                       "max_tokens": 4, "constraint": {"type": "choice", "choices": ["AB"]}}})
    assert r.status_code == 200 and r.json()["constraint_compile_seconds"] >= 0, r.text
    r = httpx.post(f"{instance.http_url}/v2/models/{LLM}/generate", headers=auth(), timeout=60,
                   json={"text_input": "A product code:", "parameters": {"max_tokens": 2}})
    assert r.status_code == 200 and "constraint_compile_seconds" not in r.json(), r.text


def test_out_of_range_sampling_value_is_a_400(instance) -> None:
    base = f"{instance.http_url}/v2/models/{LLM}/generate"
    r = httpx.post(base, json={"text_input": "x", "parameters": {"temperature": -1}},
                   headers=auth(), timeout=60)
    assert r.status_code == 400 and "temperature" in r.json()["error"]


def _prefix_cache_hits(instance) -> float:
    """Prompt tokens the engine has read from its prefix cache so far (/metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{instance.http_url}/metrics", headers=auth(), timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "vllm:prefix_cache_hits" for sample in family.samples
               if sample.name.endswith("_total") and sample.labels.get("model_name") == LLM)


def test_scoring_with_a_cached_long_context_keeps_the_engine_alive(instance) -> None:
    """A context spanning several KV blocks (144 tokens: 4 blocks of the shared instance's 32,
    1 of vLLM's CPU default of 128) is served from the prefix cache for later candidates; vLLM's
    placeholder ids at cached positions once crashed its output handler."""
    context = " ".join(["The river runs past the old stone market near the harbor."] * 12)
    body = {"context": context, "candidates": [f" Then item {i} arrived." for i in range(4)]}
    hits = _prefix_cache_hits(instance)
    for _ in range(2):  # the second round reads every block of the context from the cache
        r = httpx.post(f"{instance.http_url}/v2/models/{LLM}/score", json=body,
                       headers=auth(), timeout=180)
        assert r.status_code == 200, r.text
        assert len(r.json()["logprob_sum"]) == 4
    assert _prefix_cache_hits(instance) > hits, "the candidates never read the cached context"
    after = httpx.post(f"{instance.openai_url}/completions", headers=auth(), timeout=60,
                       json={"model": LLM, "prompt": "Hi", "max_tokens": 2})
    assert after.status_code == 200, after.text
