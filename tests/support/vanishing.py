"""Clients that start long generations and vanish mid-request, and how long the engine takes
to drop them: shared by the real-engine cancellation test and `bench/cancellation.py`.

Half the clients stream and leave after the first event; the other half wait for a whole
answer that cannot come in time (thousands of tokens, `ignore_eos`) and leave. They all leave
at once, when the engine holds every one of them and every stream has had its first event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import grpc
import httpx
from tritonclient.grpc import service_pb2, service_pb2_grpc

LONG = {"max_tokens": 4000, "ignore_eos": True, "temperature": 1.0}


async def engine_load(metrics: httpx.AsyncClient, model: str) -> float:
    """Requests the engine is running or holding in its queue, from `/metrics`."""
    text = (await metrics.get("/metrics", timeout=10)).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
               and f'model_name="{model}"' in line)


class Streams:
    """How many of the streaming clients have had their first event."""

    def __init__(self) -> None:
        self.num_started = 0


async def openai_client(http_url: str, model: str, index: int, streams: Streams,
                        headers: dict[str, str] | None = None) -> None:
    """A chat completion that never ends for this client: streamed when `index` is even."""
    body = {"model": model, "messages": [{"role": "user", "content": "Tell a long story."}],
            **LONG, "stream": index % 2 == 0}
    async with httpx.AsyncClient(base_url=http_url, timeout=None,
                                 headers=headers or {}) as client:
        if not body["stream"]:
            reply = await client.post("/v1/chat/completions", json=body)
            raise AssertionError(f"answered before the client left: {reply.status_code} "
                                 f"{reply.text[:300]}")
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200, await reply.aread()
            # held, not dropped: a dropped line iterator closes the connection at once
            lines = reply.aiter_lines()
            async for line in lines:
                if line.startswith("data:"):
                    break  # mid-stream: one event read, then nothing more
            streams.num_started += 1
            await asyncio.Event().wait()


def kserve_request(model: str, *, stream: bool, max_tokens: int = LONG["max_tokens"]) -> Any:
    """A KServe ModelInferRequest for a long generation (or a short one)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    sampling = json.dumps({**LONG, "max_tokens": max_tokens}).encode()
    for name, datatype, value in (
            ("text_input", "BYTES", b"Tell a long story."),
            ("sampling_parameters", "BYTES", sampling), ("stream", "BOOL", stream),
            ("exclude_input_in_output", "BOOL", True)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1])
        if datatype == "BYTES":
            tensor.contents.bytes_contents.append(value)
        else:
            tensor.contents.bool_contents.append(value)
    return request


async def grpc_client(target: str, model: str, index: int, streams: Streams,
                      metadata: Sequence[tuple[str, str]] = ()) -> None:
    """A KServe gRPC generation that never ends for this client: ModelStreamInfer (the
    request stream left open) when `index` is even, else ModelInfer."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        if index % 2:
            await stub.ModelInfer(kserve_request(model, stream=False), metadata=metadata)
            raise AssertionError("answered before the client left")
        never = asyncio.Event()

        async def requests():
            yield kserve_request(model, stream=True)
            await never.wait()  # no half-close: a conversation still open

        call = stub.ModelStreamInfer(requests(), metadata=metadata)
        try:
            response = await call.read()  # mid-stream: one response read
            assert not response.error_message, response.error_message
            streams.num_started += 1
            await never.wait()
        finally:
            call.cancel()


Client = Callable[[int, Streams], Coroutine[Any, Any, None]]


async def vanish(metrics_url: str, model: str, client: Client, num_clients: int, *,
                 start_timeout_s: float = 300, give_up_s: float = 30) -> float:
    """Start `num_clients` clients (`client(index, streams)`), wait until the engine holds all
    of them and the streams have started, cancel them all (their connections close); seconds
    from then until the engine holds none (`give_up_s` at most)."""
    async with httpx.AsyncClient(base_url=metrics_url) as metrics:
        if await engine_load(metrics, model) != 0:
            raise RuntimeError("the engine was busy before the clients started")
        streams = Streams()
        tasks = [asyncio.create_task(client(i, streams)) for i in range(num_clients)]
        deadline = time.monotonic() + start_timeout_s
        while (streams.num_started < (num_clients + 1) // 2
               or await engine_load(metrics, model) < num_clients):
            for task in tasks:
                if task.done():
                    task.result()  # a client that failed says why
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine never held all {len(tasks)} clients")
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        left = time.monotonic()
        while await engine_load(metrics, model) > 0 and time.monotonic() - left < give_up_s:
            await asyncio.sleep(0.02)
        return time.monotonic() - left
