"""KServe v2 over gRPC: `inference.GRPCInferenceService`, with the protos tritonclient ships.

Outputs always travel as `raw_output_contents`; inputs may come raw or as typed `contents`.
`ModelStreamInfer` serves decoupled models: every response of a request is sent as it comes,
the last one flagged with the parameter `triton_final_response`=true. Methods raise
`podium.errors`; one interceptor (`podium.errors.interceptor`) turns them into gRPC statuses.

A request is decoded only once its model's engine has room (`repository.inference`): under
overload ModelInfer is refused RESOURCE_EXHAUSTED with `retry-after` trailing metadata, and a
ModelStreamInfer request gets the refusal as its `error_message` (the stream stays open), both
before its tensors are decoded or its prompt tokenized.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from podium.auth_keys import Access
from podium.backends import deadline
from podium.backends.base import InferenceRequest, InferenceResponse, Tensor
from podium.errors import InvalidArgument, NotFound, Unavailable
from podium.errors.interceptor import ErrorInterceptor
from podium.errors.render import grpc_status, problem_of
from podium.frontends import kserve_codec as codec
from podium.frontends import kserve_validate as validate
from podium.frontends.grpc_undecodable import add_service
from podium.frontends.kserve_common import (
    check_unload_parameters,
    load_request,
    model_metadata,
    server_metadata,
)
from podium.frontends.kserve_limits import KServeLimits
from podium.frontends.safe_json import loads_value
from podium.metrics import request_log
from podium.metrics.grpc_log import track_grpc
from podium.repository import ModelRepository, RequestFor, inference

# typed `contents` fields by datatype; FP16 and BF16 have none and must be sent raw
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def create_server(repository: ModelRepository, *, port: int, server_ready: Callable[[], bool],
                  host: str = "0.0.0.0", api_key: str | None = None,
                  access: Access | None = None,
                  limits: KServeLimits | None = None) -> grpc.aio.Server:
    """A gRPC server (not started) serving `repository`; `await server.start()` opens `port`.
    With `api_key` (every role) or `access` (keys per role), every method but ServerLive
    requires `authorization: Bearer <key>`."""
    from podium.auth import grpc_interceptors

    limits = limits or KServeLimits()
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", limits.grpc_max_message_bytes),
                 ("grpc.max_send_message_length", 256 << 20)],
        interceptors=[ErrorInterceptor(), *grpc_interceptors(
            Access.single(api_key) if api_key else access)])
    add_service(InferenceService(repository, server_ready, limits), server)
    server.add_insecure_port(f"{host}:{port}")
    return server


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 gRPC service over one model repository."""

    def __init__(self, repository: ModelRepository, server_ready: Callable[[], bool],
                 limits: KServeLimits | None = None) -> None:
        self._repository = repository
        self._server_ready = server_ready
        self._limits = limits or KServeLimits()

    # -- health and metadata -------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=bool(self._server_ready()))

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            entry = self._repository.find(request.name, request.version or None)
            ready = entry.state == "READY"
        except (NotFound, Unavailable):
            ready = False
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(**server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        data = model_metadata(self._repository, request.name, request.version or None)
        return json_format.ParseDict(data, service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = dict(self._repository.find(request.name,
                                            request.version or None).backend.config())
        if not all(v.isdigit() for v in
                   config.get("version_policy", {}).get("specific", {}).get("versions", [])):
            config.pop("version_policy")  # the proto holds numeric versions only
        message = json_format.ParseDict(config, model_config_pb2.ModelConfig(),
                                        ignore_unknown_fields=True)
        return service_pb2.ModelConfigResponse(config=message)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        rows = self._repository.statistics(request.name or None, request.version or None)
        return json_format.ParseDict({"model_stats": rows}, service_pb2.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    # -- repository ----------------------------------------------------------------------------
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        rows = self._repository.index(ready_only=request.ready)
        return service_pb2.RepositoryIndexResponse(
            models=[service_pb2.RepositoryIndexResponse.ModelIndex(**row) for row in rows])

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        parameters = {key: _repository_parameter(value)
                      for key, value in request.parameters.items()}
        if isinstance(parameters.get("version_policy"), str):
            parameters["version_policy"] = _json_parameter("version_policy",
                                                           parameters["version_policy"])
        await self._repository.load_over_api(request.model_name, load_request(parameters))
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        check_unload_parameters({key: _repository_parameter(value)
                                 for key, value in request.parameters.items()})
        await self._repository.unload_over_api(request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    # -- inference -----------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        async with track_grpc(context, "ModelInfer"):
            with deadline.scope(deadline.from_grpc(context)):  # past it: cancelled
                response = await deadline.within(self._repository.infer(
                    request.model_name, request.model_version or None,
                    self._decoder(request)))
            return encode_response(response, request.model_name, response.model_version)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any
                               ) -> AsyncIterator[Any]:
        # requests of one stream run concurrently; their responses interleave, told apart by id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def read() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(self._stream_one(request, queue))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await asyncio.gather(*list(tasks))
            finally:  # the client half-closed or went away: end the response stream
                await queue.put(None)

        async with track_grpc(context, "ModelStreamInfer"):
            with deadline.scope(deadline.from_grpc(context)):  # the requests' tasks inherit it
                reader = asyncio.create_task(read())  # inside: its errors name the call's id
            try:
                while (message := await queue.get()) is not None:
                    yield message
            finally:
                reader.cancel()
                for task in list(tasks):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

    def _decoder(self, request: Any) -> RequestFor:
        """Decodes `request` once the engine has room (`inference`: a full engine's refusal
        comes first, with nothing decoded or tokenized)."""
        return lambda _backend: decode_request(request, self._limits)

    async def _stream_one(self, request: Any, queue: asyncio.Queue[Any]) -> None:
        empty_final = _request_flag(request, "triton_enable_empty_final_response")
        try:
            async with self._repository.lease(request.model_name,
                                              request.model_version or None) as entry:
                # hold one response back so the last one can carry the final flag
                held: InferenceResponse | None = None
                async for response in inference.infer_stream(entry, self._decoder(request)):
                    if held is not None:
                        await queue.put(_stream_message(held, request, final=False))
                    held = response
            if held is not None and (held.outputs or empty_final):
                await queue.put(_stream_message(held, request, final=True))
            elif empty_final:
                await queue.put(_stream_message(
                    InferenceResponse(outputs=[], id=request.id, model_version=entry.version),
                    request, final=True))
        except Exception as exc:  # Triton's way: this request fails alone, the stream stays open
            code, details = grpc_status(problem_of(exc))
            # the call itself ends OK; its log line and podium:requests say the first failure
            call = request_log.current()
            if call is not None and call.status is None:
                call.status = code
            await queue.put(service_pb2.ModelStreamInferResponse(error_message=details))


# -- messages ------------------------------------------------------------------------------------
def decode_request(request: Any, limits: KServeLimits | None = None) -> InferenceRequest:
    """A ModelInferRequest as an InferenceRequest (raw or typed contents)."""
    validate.check_grpc_request(request, limits or KServeLimits())
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(f"raw_input_contents holds {len(raw)} tensors for "
                              f"{len(request.inputs)} inputs; send one per input")
    inputs: dict[str, Tensor] = {}
    for index, tensor in enumerate(request.inputs):
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if name in inputs:
            raise InvalidArgument(f"input {name!r} is given twice", param=name)
        codec.numpy_dtype(datatype, name=name)
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"input {name!r}: shape {shape} must be non-negative",
                                  param=name)
        if raw:
            inputs[name] = codec.tensor_from_raw(name, datatype, shape, raw[index])
        else:
            field = _CONTENTS_FIELD.get(datatype)
            if field is None:
                raise InvalidArgument(f"input {name!r}: {datatype} has no typed contents; send "
                                      "it in raw_input_contents", param=name)
            values = list(getattr(tensor.contents, field))
            inputs[name] = codec.tensor_from_json(name, datatype, shape, values)
    return InferenceRequest(
        inputs=inputs, id=request.id,
        parameters={k: _parameter(v) for k, v in request.parameters.items()
                    if not k.startswith("triton_")},
        requested_outputs=[o.name for o in request.outputs] or None)


def encode_response(response: InferenceResponse, model: str, version: str) -> Any:
    """An InferenceResponse as a ModelInferResponse with raw output contents."""
    message = service_pb2.ModelInferResponse(model_name=model, model_version=version,
                                             id=response.id)
    for key, value in response.parameters.items():
        _set_parameter(message.parameters[key], value)
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_output_contents.append(codec.tensor_to_raw(tensor))
    return message


def _stream_message(response: InferenceResponse, request: Any, *, final: bool) -> Any:
    message = encode_response(response, request.model_name, response.model_version)
    message.id = response.id or request.id
    message.parameters["triton_final_response"].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=message)


def _parameter(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return getattr(value, kind) if kind else None


def _repository_parameter(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return getattr(value, kind) if kind else None


def _request_flag(request: Any, key: str) -> bool:
    return key in request.parameters and bool(_parameter(request.parameters[key]))


def _json_parameter(name: str, text: str) -> Any:
    return loads_value(text, field=f"parameter {name!r}")


def _set_parameter(target: Any, value: Any) -> None:
    if isinstance(value, bool | np.bool_):
        target.bool_param = bool(value)
    elif isinstance(value, int | np.integer):
        target.int64_param = int(value)
    elif isinstance(value, float | np.floating):
        target.double_param = float(value)
    else:
        target.string_param = value if isinstance(value, str) else json.dumps(value)
