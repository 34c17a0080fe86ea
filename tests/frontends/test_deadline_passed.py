"""A request admitted in time whose deadline passes while it runs is stopped there: its
generation is aborted in the engine (its place freed) and it is answered 504 naming
X-Request-Timeout (gRPC: DEADLINE_EXCEEDED); a stream that already started ends with that
error as its last event. A bad X-Request-Timeout is a 400 naming the header. Each is followed
by a good request. Fake engines here; the real one: tests/frontends/test_admission_real.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.fake_llm_instance import RefusingEngine, llm_instance
from tests.support.openai_instance import CHAT, COMPLETIONS, GOOD, client_for, openai_app
from tests.support.polling import async_eventually

STUCK_S = 30.0
"""How long every word after the first takes: far past any deadline below."""


class StuckEngine(RefusingEngine):
    """Its first word at once, then stuck; records each request it was made to abort
    (cancelled, or its generator closed), as AsyncLLM aborts them."""

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str
                       ) -> AsyncIterator[Any]:
        first = True
        try:
            async for output in super().generate(prompt, sampling_params, request_id):
                if not first:
                    await asyncio.sleep(STUCK_S)
                first = False
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise


def _generate(**sampling: Any) -> dict[str, Any]:
    return {"text_input": "what is the capital of France?", "parameters": sampling}


async def test_kserve_http_stops_a_generation_past_its_deadline(tmp_path: Path) -> None:
    engine = StuckEngine()
    async with llm_instance(tmp_path, engine=engine) as (client, _, _):
        r = await client.post("/v2/models/llm/generate", json=_generate(max_tokens=5),
                              headers={"X-Request-Timeout": "0.5"})
        assert r.status_code == 504, r.text
        assert "X-Request-Timeout" in r.json()["error"]
        await async_eventually(lambda: len(engine.aborted) == 1)
        # a stream that started: its last event is the 504, and the engine aborted it
        async with client.stream("POST", "/v2/models/llm/generate_stream",
                                 json=_generate(max_tokens=5),
                                 headers={"X-Request-Timeout": "1"}) as stream:
            assert stream.status_code == 200
            events = [json.loads(line[6:]) async for line in stream.aiter_lines()
                      if line.startswith("data: ")]
        assert events[0]["text_output"] == "Paris", events
        assert "X-Request-Timeout" in events[-1]["error"], events
        await async_eventually(lambda: len(engine.aborted) == 2)
        good = await client.post("/v2/models/llm/generate", json=_generate(max_tokens=1),
                                 headers={"X-Request-Timeout": "30"})
        assert good.status_code == 200, good.text


async def test_kserve_grpc_stops_a_call_past_its_deadline(tmp_path: Path) -> None:
    engine = StuckEngine()
    async with llm_instance(tmp_path, engine=engine) as (_, _, target):

        def request(max_tokens: int) -> Any:
            message = service_pb2.ModelInferRequest(model_name="llm")
            for name, value in (("text_input", "the capital of France?"),
                                ("sampling_parameters", json.dumps({"max_tokens": max_tokens}))):
                tensor = message.inputs.add(name=name, datatype="BYTES", shape=[1])
                tensor.contents.bytes_contents.append(value.encode())
            return message

        async with grpc.aio.insecure_channel(target) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as passed:
                await stub.ModelInfer(request(5), timeout=0.5)
            assert passed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await async_eventually(lambda: len(engine.aborted) == 1)
            answer = await stub.ModelInfer(request(1), timeout=30)  # a good one follows
            assert answer.raw_output_contents or answer.outputs


class StuckServing:
    """vLLM's completion serving object whose generation gets stuck after its first chunk;
    records the requests it was made to abort."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.stuck = True

    async def create_completion(self, request: Any, raw: Any) -> Any:
        if not request.stream:
            try:
                if self.stuck:
                    await asyncio.sleep(STUCK_S)
            except asyncio.CancelledError:
                self.aborted.append("whole")
                raise
            return SimpleNamespace(model_dump=lambda **_: {"object": "fake", "choices": [
                {"index": 0, "text": "ok"}]})
        return self._stream()

    async def _stream(self) -> AsyncIterator[str]:
        try:
            yield 'data: {"choices": [{"index": 0, "text": "Paris"}]}\n\n'
            await asyncio.sleep(STUCK_S)
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append("stream")
            raise


async def test_openai_stops_a_generation_past_its_deadline() -> None:
    app, _ = openai_app()
    backend = app.state.instance.repository.entries()[0].backend
    serving = StuckServing()
    backend.state = SimpleNamespace(openai_serving_completion=serving)
    async with client_for(app) as client:
        r = await client.post(COMPLETIONS, json=GOOD[COMPLETIONS],
                              headers={"X-Request-Timeout": "0.5"})
        assert r.status_code == 504, r.text
        error = r.json()["error"]
        assert error["param"] == "X-Request-Timeout" and error["type"] == "timeout_error"
        assert serving.aborted == ["whole"]
        async with client.stream("POST", COMPLETIONS, json={**GOOD[COMPLETIONS], "stream": True},
                                 headers={"X-Request-Timeout": "1"}) as stream:
            assert stream.status_code == 200
            lines = [line async for line in stream.aiter_lines() if line.startswith("data: ")]
        assert "Paris" in lines[0] and lines[-1] == "data: [DONE]", lines
        error = json.loads(lines[-2][6:])["error"]
        assert error["code"] == 504 and error["param"] == "X-Request-Timeout", lines
        await async_eventually(lambda: serving.aborted == ["whole", "stream"])
        serving.stuck = False
        good = await client.post(COMPLETIONS, json=GOOD[COMPLETIONS],
                                 headers={"X-Request-Timeout": "30"})
        assert good.status_code == 200, good.text


@pytest.mark.parametrize("value", ["-1", "0", "nan", "NaN", "inf", "1e9", "86400.5", "soon",
                                   "", "1,5", "0x10"],
                         ids=["negative", "zero", "nan", "NaN-case", "infinite", "huge",
                              "past-a-day", "words", "empty", "comma", "hex"])
@pytest.mark.parametrize("path", [CHAT, "/v2/models/llm/generate"], ids=["openai", "kserve"])
async def test_a_bad_x_request_timeout_is_a_400_naming_it(path: str, value: str,
                                                          tmp_path: Path) -> None:
    if path == CHAT:
        body: dict[str, Any] = GOOD[CHAT]
        client_cm: Any = client_for(openai_app()[0])
    else:
        body = _generate(max_tokens=1)
        client_cm = _first(llm_instance(tmp_path))
    async with client_cm as client:
        r = await client.post(path, json=body, headers={"X-Request-Timeout": value})
        assert r.status_code == 400, r.text
        assert "X-Request-Timeout" in r.text
        good = await client.post(path, json=body, headers={"X-Request-Timeout": "30"})
        assert good.status_code == 200, good.text


@contextlib.asynccontextmanager
async def _first(served: Any) -> AsyncIterator[Any]:
    async with served as (client, *_):
        yield client
