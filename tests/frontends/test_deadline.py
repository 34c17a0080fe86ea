"""A request's deadline reaches the engine's check on every protocol (X-Request-Timeout on
OpenAI /v1 and KServe /v2 HTTP, the call's deadline on gRPC), and a request that cannot finish
in time is refused at once with 429 / RESOURCE_EXHAUSTED and Retry-After, never run; each
refusal is followed by a good request. Fake engines whose input step runs Podium's check, as
the real engine's does once `deadline_check.install` wrapped it (the real one:
tests/frontends/test_admission_real.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.backends.vllm import deadline_check
from tests.support.admission_rates import RATES
from tests.support.fake_llm_instance import RefusingEngine, llm_instance
from tests.support.openai_instance import CHAT, GOOD, client_for, openai_app

LONG = {"max_tokens": 50, "ignore_eos": True}
"""Must produce 50 tokens: 5 s at RATES' decode step (0.1 s)."""


def _checked(prompt_ids: list[int], params: dict[str, Any]) -> None:
    """What the wrapped input processor does once the prompt is tokenized."""
    engine = SimpleNamespace(get_num_queued_tokens=lambda: 0)
    request = SimpleNamespace(prompt_token_ids=prompt_ids, pooling_params=None,
                              sampling_params=SimpleNamespace(**params))
    deadline_check.check(engine, RATES, request)


class DeadlineEngine(RefusingEngine):
    """The fake engine, checking each request's deadline before it generates."""

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str
                       ) -> AsyncIterator[Any]:
        _checked(self.tokenizer.encode(prompt), dict(sampling_params))
        async for output in super().generate(prompt, sampling_params, request_id):
            yield output


def _generate(**sampling: Any) -> dict[str, Any]:
    return {"text_input": "what is the capital of France?", "parameters": sampling}


async def test_kserve_http_refuses_a_request_past_its_deadline(tmp_path: Path) -> None:
    async with llm_instance(tmp_path, engine=DeadlineEngine()) as (client, _, _):
        for path in ("/v2/models/llm/generate", "/v2/models/llm/generate_stream"):
            r = await client.post(path, json=_generate(**LONG),
                                  headers={"X-Request-Timeout": "2"})
            assert r.status_code == 429, r.text
            assert r.headers["Retry-After"] == "1"
            assert "cannot finish within its deadline" in r.json()["error"]
        # the same request with room for it, and a short one within the deadline
        r = await client.post("/v2/models/llm/generate", json=_generate(**LONG),
                              headers={"X-Request-Timeout": "100"})
        assert r.status_code == 200, r.text
        r = await client.post("/v2/models/llm/generate", json=_generate(max_tokens=3),
                              headers={"X-Request-Timeout": "5"})
        assert r.status_code == 200, r.text
        bad = await client.post("/v2/models/llm/generate", json=_generate(max_tokens=3),
                                headers={"X-Request-Timeout": "soon"})
        assert bad.status_code == 400 and "X-Request-Timeout" in bad.json()["error"]


async def test_kserve_grpc_refuses_a_call_past_its_deadline(tmp_path: Path) -> None:
    async with llm_instance(tmp_path, engine=DeadlineEngine()) as (_, _, target):

        def request(max_tokens: int) -> Any:
            message = service_pb2.ModelInferRequest(model_name="llm")
            for name, value in (("text_input", "the capital of France?"),
                                ("sampling_parameters",
                                 f'{{"max_tokens": {max_tokens}, "ignore_eos": true}}')):
                tensor = message.inputs.add(name=name, datatype="BYTES", shape=[1])
                tensor.contents.bytes_contents.append(value.encode())
            return message

        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            call = stub.ModelInfer(request(50), timeout=2)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "deadline" in refused.value.details()
            assert ("retry-after", "1") in tuple(await call.trailing_metadata())
            answer = await stub.ModelInfer(request(3), timeout=5)  # a good one follows
            assert answer.raw_output_contents or answer.outputs


class DeadlineServing:
    """vLLM's chat serving object over an engine that checks deadlines: the refusal raised
    from the engine, or answered as vLLM's own error response (a stream's first event)."""

    def __init__(self) -> None:
        self.answer_with_response = False

    async def create_chat_completion(self, request: Any, raw: Any) -> Any:
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response,
        )

        params = {"max_tokens": request.max_tokens or 16,
                  "ignore_eos": bool(getattr(request, "ignore_eos", False)), "min_tokens": 0}
        try:
            _checked([1] * 20, params)
        except deadline_check.DeadlineRefused as exc:
            if self.answer_with_response:
                return create_error_response(exc)
            raise
        return SimpleNamespace(model_dump=lambda **_: {"object": "fake", "choices": [
            {"index": 0, "text": "ok"}]})


@pytest.mark.parametrize("answered", [False, True], ids=["raised", "error-response"])
async def test_openai_refuses_a_request_past_its_deadline(answered: bool) -> None:
    app, _ = openai_app()
    backend = app.state.instance.repository.entries()[0].backend
    serving = DeadlineServing()
    serving.answer_with_response = answered
    backend.state = SimpleNamespace(openai_serving_chat=serving)
    body = {**GOOD[CHAT], **LONG}
    async with client_for(app) as client:
        r = await client.post(CHAT, json=body, headers={"X-Request-Timeout": "2"})
        assert r.status_code == 429, r.text
        assert r.headers["Retry-After"] == "1"
        error = r.json()["error"]
        assert error["type"] == "rate_limit_error" and error["param"] == "X-Request-Timeout"
        bad = await client.post(CHAT, json=GOOD[CHAT], headers={"X-Request-Timeout": "-3"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Request-Timeout"
        good = await client.post(CHAT, json=body, headers={"X-Request-Timeout": "100"})
        assert good.status_code == 200, good.text
