"""Streamed generation over KServe v2 gRPC for the overload benches: a `rawload` target, so
`rawload`'s open and closed loops (several processes, arrivals on absolute times) send it.

One request is one `ModelStreamInfer` call carrying one `ModelInferRequest` (Triton's
generate contract: `text_input`, `sampling_parameters`, `stream`=true), as tritonclient's
stream sends a request; grpc.aio, one channel per closed-loop client or open-loop process
(created in that process: grpc must not be live across the fork). Timed to the first response
carrying text (an LLM's time to the first token), or to the refusal.

Status, in HTTP's words so the bench counts both protocols alike: 200 for a stream that ended
well; a call that ends with a gRPC error, that code's HTTP status (RESOURCE_EXHAUSTED: 429);
a request refused inside the stream (Triton's way: its `error_message`, no code), 429 when the
message is Podium's overload refusal (a full engine, or a deadline it cannot meet), else 500.
Each call carries an `x-request-id` returned with its answer, so the bench finds its line in the
server's request log (the refusal's time inside the server).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from bench.harness.loops import check_loopback

TIMEOUT_S = 120.0
OVERLOAD_MESSAGES = ("the engine is overloaded", "the request cannot finish within its deadline")
"""How Podium's refusals for load begin (`backends.vllm.checks.overloaded`, `deadline_check`)."""
HTTP_STATUS = {"RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
               "INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "UNAUTHENTICATED": 401}


@dataclass(frozen=True)
class GrpcTarget:
    """A model on a loopback gRPC port and the generation to ask of it."""

    address: str
    """host:port"""
    model: str
    prompt: str
    sampling: dict[str, Any]
    """vLLM sampling parameters (`max_tokens`, `ignore_eos`, ...)."""

    def __post_init__(self) -> None:
        check_loopback(self.address)

    def connections(self) -> _Channel:
        return _Channel(self)


class _Channel:
    """One grpc.aio channel sending the target's request, one stream call per request."""

    _ids = itertools.count()

    def __init__(self, target: GrpcTarget) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self.grpc = grpc
        self.channel = grpc.aio.insecure_channel(target.address)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.request = service_pb2.ModelInferRequest(model_name=target.model)
        for name, value in (("text_input", target.prompt.encode()),
                            ("sampling_parameters", json.dumps(target.sampling).encode())):
            tensor = self.request.inputs.add(name=name, datatype="BYTES", shape=[1])
            tensor.contents.bytes_contents.append(value)
        self.request.inputs.add(name="stream", datatype="BOOL", shape=[1]
                                ).contents.bool_contents.append(True)
        self.prefix = f"g{os.getpid()}-{next(self._ids)}-"
        self.sent = 0

    async def send(self) -> tuple[int, float, str]:
        """One streamed generation: (status, seconds to its first text or its refusal, id)."""
        request_id = f"{self.prefix}{self.sent}"
        self.sent += 1
        sent = time.monotonic()
        status, took = 200, None
        call = self.stub.ModelStreamInfer(metadata=(("x-request-id", request_id),),
                                          timeout=TIMEOUT_S)
        try:
            await call.write(self.request)
            await call.done_writing()
            async for message in call:
                if message.error_message:
                    status = 429 if message.error_message.startswith(OVERLOAD_MESSAGES) else 500
                    took = took or time.monotonic() - sent
                elif took is None and message.infer_response.raw_output_contents:
                    took = time.monotonic() - sent
        except self.grpc.aio.AioRpcError as err:
            status = HTTP_STATUS.get(err.code().name, 500)
            took = None if status == 429 else took  # a refusal is timed to its answer
        except (OSError, TimeoutError):
            status = 599
        return status, took if took is not None else time.monotonic() - sent, request_id
