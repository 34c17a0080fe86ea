"""Clients that leave mid-request, over HTTP (whole answer or stream) and gRPC (unary or
stream), and a wait for what the server did about it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx
from tritonclient.grpc import service_pb2, service_pb2_grpc


def leave_whole(url: str, body: dict[str, Any], *, after_s: float = 0.5) -> float:
    """POST and hang up after `after_s` without an answer; returns when it hung up."""
    try:
        reply = httpx.post(url, json=body, timeout=after_s)
    except httpx.ReadTimeout:
        return time.monotonic()
    raise AssertionError(f"answered before the client left: {reply.status_code} {reply.text}")


def leave_stream(url: str, body: dict[str, Any], *, events: int) -> float:
    """POST a streaming request, read `events` lines with data, then hang up; returns when it
    hung up."""
    with httpx.stream("POST", url, json=body, timeout=10) as reply:
        assert reply.status_code == 200, reply.read()
        lines = (line for line in reply.iter_lines() if line.startswith("data:"))
        for _ in range(events):
            next(lines)
    return time.monotonic()


def llm_request(model: str, request_id: str, *, stream: bool) -> Any:
    """A KServe ModelInferRequest for a vLLM-contract model."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"Capital?")
    flag = request.inputs.add(name="stream", datatype="BOOL", shape=[1])
    flag.contents.bool_contents.append(stream)
    return request


def cancel_unary(target: str, request: Any, *, after_s: float = 0.5) -> float:
    """ModelInfer, cancelled by the client after `after_s`; returns when it cancelled."""
    with grpc.insecure_channel(target) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(request)
        time.sleep(after_s)
        assert not call.done(), "answered before the client cancelled"
        call.cancel()
        return time.monotonic()


def cancel_stream(target: str, request: Any, *, after_s: float = 0.5) -> float:
    """ModelStreamInfer with one request, cancelled after `after_s` (the request stream left
    open, as a client in the middle of a conversation does); returns when it cancelled."""
    cancelled = threading.Event()

    def requests():
        yield request
        cancelled.wait(30)  # no half-close: only the cancel ends the call

    with grpc.insecure_channel(target) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        time.sleep(after_s)
        call.cancel()
        cancelled.set()
        return time.monotonic()


def wait_for(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `condition` held, or None if it did not within `timeout_s`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(0.02)
    return time.monotonic() - started
