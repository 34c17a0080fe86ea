"""Triton's vLLM backend and BLS on the real engine: the suite's spare instance serves the
default LLM from a Triton layout (`1/model.json` pointing at its cached folder) and `bls_llm`,
a Python model calling it (tests/support/spare.py). No engine of its own: the spare's one
engine serves these tests, the prefix-routing test and the drain."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import LLM
from tests.support.harness import RunningInstance
from tests.support.spare import Spare

pytestmark = pytest.mark.engine  # the spare instance's engine

PROMPT = "The capital of France is"
SAMPLING = json.dumps({"max_tokens": 8, "temperature": 0})


@pytest.fixture
def llm(spare_instance: Spare) -> RunningInstance:
    return spare_instance.get()


def _text(module, name: str, value: str):
    tensor = module.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
    return tensor


def _vllm_inputs(module, stream: bool) -> list:
    flags = []
    for name, value in (("stream", stream), ("exclude_input_in_output", True)):
        tensor = module.InferInput(name, [1], "BOOL")
        tensor.set_data_from_numpy(np.array([value]))
        flags.append(tensor)
    return [_text(module, "text_input", PROMPT), _text(module, "sampling_parameters", SAMPLING),
            *flags]


def _first(result, name: str) -> str:
    array = result.as_numpy(name)
    if array is None or array.size == 0:  # a stream's final part may carry no text
        return ""
    value = array.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def test_the_vllm_backend_model_and_bls_over_it(llm: RunningInstance) -> None:
    http = httpclient.InferenceServerClient(llm.http_url.removeprefix("http://"))
    grpc = grpcclient.InferenceServerClient(llm.grpc_url)
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert rows[LLM]["state"] == "READY" and rows["bls_llm"]["state"] == "READY", rows
    assert http.get_model_config(LLM)["backend"] == "vllm"

    direct = _first(http.infer(LLM, _vllm_inputs(httpclient, stream=False)), "text_output")
    assert direct.strip(), "the LLM answered nothing"

    parts: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: parts.put((result, error)))
    try:
        grpc.async_stream_infer(LLM, _vllm_inputs(grpcclient, stream=True))
        streamed = []
        while True:
            result, error = parts.get(timeout=120)
            assert error is None, error
            streamed.append(_first(result, "text_output"))
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        grpc.stop_stream()
    assert len(streamed) > 1 and "".join(streamed) == direct  # greedy: the same text

    for client, module in ((http, httpclient), (grpc, grpcclient)):
        answer = client.infer("bls_llm", [_text(module, "PROMPT", PROMPT)])
        assert _first(answer, "ANSWER") == direct.upper()
