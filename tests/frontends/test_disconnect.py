"""A client that leaves mid-request cancels its generation at the instance, on every path:
OpenAI whole answers and streams, KServe HTTP generate / infer / generate_stream, KServe gRPC
ModelInfer and ModelStreamInfer. Each leave is followed by a good request on the same server."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.kserve_instance import LLM, Instance
from tests.support.leaving import (
    cancel_stream,
    cancel_unary,
    leave_stream,
    leave_whole,
    llm_request,
    wait_for,
)
from tests.support.servers import Served
from tests.support.slow_openai import SlowServing, openai_body, serve_slow_openai

CANCELLED_WITHIN_S = 2.0  # the bound; the generations here would take 10 s or more


@pytest.fixture(scope="module")
def slow_openai() -> Iterator[tuple[Served, SlowServing]]:
    served, serving = serve_slow_openai()
    yield served, serving
    served.stop()


OPENAI_CASES = {"chat": ("/v1/chat/completions", False),
                "completion": ("/v1/completions", False),
                "chat-stream": ("/v1/chat/completions", True)}


@pytest.mark.parametrize("case", list(OPENAI_CASES))
def test_openai_client_that_leaves_cancels_its_generation(
        slow_openai: tuple[Served, SlowServing], case: str) -> None:
    served, serving = slow_openai
    path, stream = OPENAI_CASES[case]
    request_id = f"gone-openai-{case}"
    serving.delay_s = 10.0
    if stream:
        leave_stream(served.url + path, openai_body(path, request_id, stream=True), events=1)
    else:
        leave_whole(served.url + path, openai_body(path, request_id, stream=False))
    assert request_id in serving.started
    assert wait_for(lambda: request_id in serving.cancelled, CANCELLED_WITHIN_S) is not None, \
        "the generation went on for a client that had left"
    serving.delay_s = 0.0
    reply = httpx.post(served.url + path, json=openai_body(path, f"good-{case}", stream=False),
                       timeout=10)
    assert reply.status_code == 200, reply.text


@pytest.fixture
def slow_engine(kserve_instance: Instance) -> Iterator[Instance]:
    """The fake LLM taking 5 s per word (the first included) for the test's duration."""
    assert kserve_instance.llm is not None
    kserve_instance.llm.engine.word_delay_s = 5.0
    try:
        yield kserve_instance
    finally:
        kserve_instance.llm.engine.word_delay_s = 0.0
    reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/{LLM}/generate",
                       json={"text_input": "Capital?", "parameters": {"max_tokens": 2}})
    assert reply.status_code == 200, reply.text  # the server still answers a good request


def _aborted(instance: Instance, request_id: str) -> bool:
    assert instance.llm is not None
    return request_id in instance.llm.engine.aborted


@pytest.mark.parametrize("route", ["generate", "generate_stream", "infer"])
def test_kserve_http_client_that_leaves_cancels_its_generation(slow_engine: Instance,
                                                               route: str) -> None:
    request_id = f"gone-http-{route}"
    if route == "infer":
        body = {"id": request_id, "inputs": [{"name": "text_input", "datatype": "BYTES",
                                               "shape": [1], "data": ["Capital?"]}]}
    else:
        body = {"id": request_id, "text_input": "Capital?"}
    # a stream's headers come with its first response: the client leaves before either
    leave_whole(f"http://{slow_engine.http_url}/v2/models/{LLM}/{route}", body)
    assert wait_for(lambda: _aborted(slow_engine, request_id), CANCELLED_WITHIN_S) is not None


@pytest.mark.parametrize("method", ["ModelInfer", "ModelStreamInfer"])
def test_kserve_grpc_client_that_cancels_cancels_its_generation(slow_engine: Instance,
                                                                method: str) -> None:
    request_id = f"gone-grpc-{method}"
    if method == "ModelInfer":
        cancel_unary(slow_engine.grpc_url, llm_request(LLM, request_id, stream=False))
    else:
        cancel_stream(slow_engine.grpc_url, llm_request(LLM, request_id, stream=True))
    assert wait_for(lambda: _aborted(slow_engine, request_id), CANCELLED_WITHIN_S) is not None
