"""An adapter request on the fake engine, through a whole in-process instance: KServe requests
count their tokens per adapter (as OpenAI's do), vLLM's admission control refuses one with a
429 naming the limit (counted per adapter) and the next is served, and a cancelled one aborts
its generation on the engine and counts the tokens it had. The real-engine side is in
test_lora_real.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from podium.backends.base import Backend, InferenceRequest, Tensor
from podium.backends.tensor_text import text_tensor
from podium.backends.vllm.backend import VllmBackend
from podium.metrics import server as metrics
from podium.package.adapter import AdapterInfo
from podium.package.adapter_store import StoredAdapter
from podium.package.package import open_package, write_manifest
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_llm import REPLY, FakeLlmBackend, FakeSamplingParams
from tests.support.fake_llm_instance import RefusingEngine, served
from tests.support.lora_adapters import write_adapter_package

PROMPT = {"text_input": "what is the capital of France?"}


class LoraEngine(RefusingEngine):
    """The fake engine, taking a `lora_request` and saying how many tokens it used, as
    vLLM's RequestOutput does (`prompt_token_ids`, each completion's `token_ids`)."""

    loras: list[Any]

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str,
                       lora_request: Any = None) -> AsyncIterator[Any]:
        self.loras = [*getattr(self, "loras", []), lora_request]
        prompt_ids = self.tokenizer.encode(prompt)
        step = 0
        async for output in super().generate(prompt, sampling_params, request_id):
            step += 1  # cumulative outputs: one more word each
            for completion in output.outputs:
                completion.token_ids = list(range(step))
            output.prompt_token_ids = prompt_ids
            yield output


class LoraBase(FakeLlmBackend):
    """The fake LLM with what an `AdapterView` reads of its base (VllmBackend's own error
    mapping), serving one adapter `tone@1`."""

    engine_errors = VllmBackend.engine_errors
    sampling = staticmethod(FakeSamplingParams)

    def __init__(self, package: Any, engine: LoraEngine, adapter_dir: Path) -> None:
        super().__init__(package, engine=engine)
        self.adapter_dir = adapter_dir
        self.view: Any = None

    def adapter(self, name: str, version: str | None) -> Backend | None:
        if name != "tone" or version not in (None, "1"):
            return None
        if self.view is None:
            from podium.backends.vllm.lora import AdapterView

            info = AdapterInfo("tone", "1", self.name, self.version, 8)
            self.view = AdapterView(self, StoredAdapter(info, self.adapter_dir), 1)
            # its load (PEFT files into the engine) is test_lora_real.py's
            self.view._loaded = True
        return self.view


@pytest.fixture
async def adapter_instance(tmp_path: Path) -> AsyncIterator[tuple[Any, LoraEngine, LoraBase]]:
    package = open_package(write_manifest(tmp_path / "llm", {
        "name": "llm", "version": "1", "backend": "vllm", "lora": {},
        "weights": {"source": "path", "path": "/nonexistent/fake.gguf"}}).root)
    adapter = write_adapter_package(tmp_path / "tone", "tone", seed=1, base="llm@1", layers=1)
    instance = Instance(ServerConfig(grpc_port=-1))
    engine = LoraEngine()
    base = LoraBase(package, engine, adapter)
    await instance.repository.load(package, backend=base)
    async with served(instance) as (client, _grpc):
        yield client, engine, base


def _tokens(kind: str) -> float:
    labels = {"model": "llm", "adapter": "tone", "version": "1", "kind": kind}
    return metrics.REGISTRY.get_sample_value("podium:adapter_tokens_total", labels) or 0.0


def _requests(code: str) -> float:
    return sum(metric.value for family in metrics.REGISTRY.collect()
               if family.name == "podium:requests" for metric in family.samples
               if metric.name == "podium:requests_total"
               and metric.labels["model"] == "tone" and metric.labels["code"] == code)


@pytest.mark.parametrize("route", ["generate", "generate_stream", "infer"])
async def test_kserve_requests_of_an_adapter_count_its_tokens(adapter_instance, route: str) -> None:
    client, engine, _ = adapter_instance
    prompt, completion, served = _tokens("prompt"), _tokens("completion"), _requests("200")
    body = PROMPT if route != "infer" else {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT["text_input"]]}]}
    answer = await client.post(f"/v2/models/tone/versions/1/{route}", json=body)
    assert answer.status_code == 200, answer.text
    assert engine.loras[-1].lora_name == "tone@1"  # the engine ran it with the adapter on
    assert _tokens("prompt") - prompt == len(engine.tokenizer.encode(PROMPT["text_input"]))
    assert _tokens("completion") - completion == len(REPLY)
    assert _requests("200") - served == 1  # its request, under the adapter's name


async def test_an_adapter_request_refused_by_admission_control_is_a_429_then_one_is_served(
        adapter_instance) -> None:
    from vllm.exceptions import MaxQueuedTokensError

    client, engine, _ = adapter_instance
    refused, completion = _requests("429"), _tokens("completion")
    engine.refusal = MaxQueuedTokensError
    answer = await client.post("/v2/models/tone/generate", json=PROMPT)
    assert answer.status_code == 429, answer.text
    assert answer.headers["Retry-After"] == "1" and "max_num_queued_tokens" in answer.text
    assert _requests("429") - refused == 1  # the adapter's error, under its name
    assert _tokens("completion") == completion  # nothing generated, nothing counted
    engine.refusal = None
    answer = await client.post("/v2/models/tone/generate", json=PROMPT)
    assert answer.status_code == 200, answer.text


async def test_a_cancelled_adapter_stream_aborts_its_generation_and_counts_what_it_had(
        adapter_instance) -> None:
    client, engine, base = adapter_instance
    engine.word_delay_s = 0.05
    completion = _tokens("completion")
    request = InferenceRequest(inputs={
        "text_input": text_tensor("text_input", [PROMPT["text_input"]]),
        "stream": Tensor("stream", "BOOL", np.array([True]))}, id="leaving")
    view = base.adapter("tone", "1")
    first = asyncio.Event()

    async def consume() -> None:
        async for _response in view.infer_stream(request):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.aborted == ["leaving"]
    assert 1 <= _tokens("completion") - completion < len(REPLY)
    engine.word_delay_s = 0.0
    answer = await client.post("/v2/models/tone/generate", json=PROMPT)
    assert answer.status_code == 200, answer.text


