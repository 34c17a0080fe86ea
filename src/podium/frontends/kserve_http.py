"""KServe v2 over HTTP (Triton-compatible): health, metadata, infer, generate, repository.

Infer bodies are JSON, optionally followed by raw tensors (Triton's binary tensor extension:
`Inference-Header-Content-Length` gives the JSON's length, each binary input carries
`parameters.binary_data_size`). Errors are Triton-shaped: `{"error": "..."}` with the status
of the `podium.errors` class.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute

from podium.backends import deadline
from podium.backends.base import Backend, InferenceRequest, InferenceResponse, Tensor
from podium.backends.classic_admission import HEADER as ADMISSION_BOUND
from podium.errors import InvalidArgument, NotFound, Unavailable
from podium.errors.http import error_response
from podium.errors.render import encode, kserve_body, problem_of
from podium.frontends import kserve_codec as codec
from podium.frontends import kserve_validate as validate
from podium.frontends.disconnect import cancel_on_disconnect
from podium.frontends.kserve_common import (
    check_unload_parameters,
    load_request,
    model_metadata,
    server_metadata,
)
from podium.frontends.kserve_limits import KServeLimits, read_body
from podium.frontends.safe_json import loads_object
from podium.metrics import request_log
from podium.repository import ModelRepository

HEADER_LENGTH = "Inference-Header-Content-Length"


class _KServeRoute(APIRoute):
    """Every route answers Podium errors Triton's way, whatever app mounts the router."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            request_log.annotate(protocol="kserve_http", endpoint=self.path)
            try:
                return await handler(request)
            except Exception as exc:  # Triton-shaped even for a bug, so clients can read it
                return error_response("kserve", exc)

        return guarded


def create_router(repository: ModelRepository, *, server_ready: Callable[[], bool],
                  limits: KServeLimits | None = None) -> APIRouter:
    """Every `/v2` route of the KServe v2 HTTP protocol, served from `repository`."""
    limits = limits or KServeLimits()
    router = APIRouter(route_class=_KServeRoute)

    # -- server ------------------------------------------------------------------------------
    @router.get("/v2")
    async def metadata() -> dict[str, Any]:
        return server_metadata()

    @router.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if server_ready() else 503)

    # -- repository --------------------------------------------------------------------------
    async def _repository_body(request: Request) -> dict[str, Any]:
        return validate.check_repository_body(await _json_body(request, limits))

    @router.post("/v2/repository/index")
    async def repository_index(request: Request) -> JSONResponse:
        body = await _repository_body(request)
        return JSONResponse(repository.index(ready_only=bool(body.get("ready", False))))

    @router.post("/v2/repository/models/{model}/load")
    async def load(model: str, request: Request) -> Response:
        body = await _repository_body(request)
        await repository.load_over_api(model, load_request(body.get("parameters")))
        return Response(status_code=200)

    @router.post("/v2/repository/models/{model}/unload")
    async def unload(model: str, request: Request) -> Response:
        body = await _repository_body(request)
        check_unload_parameters(body.get("parameters") or {})
        await repository.unload_over_api(model)
        return Response(status_code=200)

    # -- models ------------------------------------------------------------------------------
    @router.get("/v2/models/stats")
    async def all_stats() -> dict[str, Any]:
        return {"model_stats": repository.statistics()}

    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        router.add_api_route(prefix, _model_metadata(repository), methods=["GET"])
        router.add_api_route(f"{prefix}/ready", _model_ready(repository), methods=["GET"])
        router.add_api_route(f"{prefix}/config", _model_config(repository), methods=["GET"])
        router.add_api_route(f"{prefix}/stats", _model_stats(repository), methods=["GET"])
        router.add_api_route(f"{prefix}/infer", _infer(repository, limits), methods=["POST"])
        router.add_api_route(f"{prefix}/generate", _generate(repository, limits, stream=False),
                             methods=["POST"])
        router.add_api_route(f"{prefix}/generate_stream",
                             _generate(repository, limits, stream=True), methods=["POST"])
        router.add_api_route(f"{prefix}/score", _score(repository, limits), methods=["POST"])
    return router


# -- model routes (one handler each, shared by the versioned and unversioned paths) ------------
def _model_metadata(repository: ModelRepository) -> Callable[..., Awaitable[Any]]:
    async def handler(model: str, version: str | None = None) -> dict[str, Any]:
        return model_metadata(repository, model, version)
    return handler


def _model_ready(repository: ModelRepository) -> Callable[..., Awaitable[Any]]:
    async def handler(model: str, version: str | None = None) -> Response:
        try:
            state = repository.find(model, version).state
        except (NotFound, Unavailable):
            state = "UNAVAILABLE"
        return Response(status_code=200 if state == "READY" else 400)
    return handler


def _model_config(repository: ModelRepository) -> Callable[..., Awaitable[Any]]:
    async def handler(model: str, version: str | None = None) -> dict[str, Any]:
        return repository.find(model, version).backend.config()
    return handler


def _model_stats(repository: ModelRepository) -> Callable[..., Awaitable[Any]]:
    async def handler(model: str, version: str | None = None) -> dict[str, Any]:
        return {"model_stats": repository.statistics(model, version)}
    return handler


def _infer(repository: ModelRepository, limits: KServeLimits) -> Callable[..., Awaitable[Any]]:
    async def handler(model: str, request: Request, version: str | None = None) -> Response:
        seconds = deadline.from_headers(request.headers)
        body = await read_body(request, limits)
        header, binary_outputs, infer_request = parse_infer_request(
            body, request.headers.get(HEADER_LENGTH), limits)
        with deadline.scope(seconds):  # past it the work is cancelled: a 504
            response = await cancel_on_disconnect(request, deadline.within(
                repository.infer(model, version, infer_request)))
        if isinstance(response, Response):  # the client left; the work was cancelled
            return response
        return encode_infer_response(response, model=model, version=response.model_version,
                                     binary_outputs=binary_outputs,
                                     default_binary=bool(header.get("parameters", {})
                                                         .get("binary_data_output", False)))
    return handler


def _generate(repository: ModelRepository, limits: KServeLimits, *, stream: bool
              ) -> Callable[..., Awaitable[Any]]:
    async def handler(model: str, request: Request, version: str | None = None) -> Response:
        with deadline.scope(deadline.from_headers(request.headers)):
            return await generate(model, request, version)

    async def generate(model: str, request: Request, version: str | None) -> Response:
        body = await _json_body(request, limits)

        def infer_request(backend: Backend) -> InferenceRequest:
            return generate_request(body, backend.inputs(), backend.max_batch_size,
                                    stream=stream)

        if not stream:
            response = await cancel_on_disconnect(request, deadline.within(
                repository.infer(model, version, infer_request)))
            if isinstance(response, Response):  # the client left; the work was cancelled
                return response
            return JSONResponse(generate_response(response, model, response.model_version))
        responses = repository.infer_stream(model, version, infer_request)
        # the first response (or the bad-request error) comes before the 200 status is sent
        try:
            first = await cancel_on_disconnect(request, deadline.within(anext(responses)))
        except BaseException:
            await responses.aclose()
            raise
        if isinstance(first, Response):  # the client left before the first response
            await responses.aclose()
            return first
        rest = deadline.until(responses, deadline.at())  # past it: the last event, a 504
        return StreamingResponse(_sse(first, rest, model, first.model_version),
                                 media_type="text/event-stream")
    return handler


def _score(repository: ModelRepository, limits: KServeLimits) -> Callable[..., Awaitable[Any]]:
    async def handler(model: str, request: Request, version: str | None = None) -> Response:
        body = await _json_body(request, limits)
        unknown = sorted(set(body) - {"context", "candidates", "id"})
        if unknown:
            raise InvalidArgument(f"score fields {unknown} are unknown; send context and "
                                  "candidates", param=unknown[0])
        context, candidates = body.get("context"), body.get("candidates")
        if not isinstance(context, str):
            raise InvalidArgument("'context' must be a string", param="context")
        if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
            raise InvalidArgument("'candidates' must be a list of strings", param="candidates")
        inputs = {"context": codec.tensor_from_json("context", "BYTES", [1], [context]),
                  "candidates": codec.tensor_from_json("candidates", "BYTES",
                                                       [len(candidates)], candidates)}
        response = await repository.infer(model, version, InferenceRequest(
            inputs=inputs, id=str(body.get("id", ""))))
        return JSONResponse(score_response(response, model, response.model_version))
    return handler


def score_response(response: InferenceResponse, model: str, version: str) -> dict[str, Any]:
    """Scores as JSON: per candidate, the summed and the per-token log-probabilities."""
    out = {tensor.name: tensor.data for tensor in response.outputs}
    lengths = out["num_tokens"].tolist()
    return {"model_name": model, "model_version": version,
            "logprob_sum": out["logprob_sum"].tolist(),
            "token_logprobs": [row[:n].tolist()
                               for row, n in zip(out["token_logprobs"], lengths, strict=True)]}


async def _sse(first: InferenceResponse, responses: AsyncIterator[InferenceResponse],
               model: str, version: str) -> AsyncIterator[bytes]:
    yield f"data: {json.dumps(generate_response(first, model, version))}\n\n".encode()
    try:
        async for response in responses:
            yield f"data: {json.dumps(generate_response(response, model, version))}\n\n".encode()
    except Exception as exc:  # headers are gone: the error travels as the last event
        yield b"data: " + encode(kserve_body(problem_of(exc))) + b"\n\n"


# -- infer body ------------------------------------------------------------------------------
def parse_infer_request(body: bytes, header_length: str | None,
                        limits: KServeLimits | None = None
                        ) -> tuple[dict[str, Any], dict[str, bool], InferenceRequest]:
    """Split JSON header and binary tensors; returns (header, per-output binary flags, request)."""
    limits = limits or KServeLimits()
    length = validate.header_length(header_length, len(body))
    header = loads_object(body[:length], max_depth=limits.max_json_depth)
    binary = memoryview(body)[length:]
    checked = validate.check_infer_header(header, limits, len(binary))
    inputs: dict[str, Tensor] = {}
    offset = 0
    for item in checked.inputs:
        name, datatype, shape = item.name, item.datatype, item.shape
        if name in inputs:
            raise InvalidArgument(f"input {name!r} is given twice", param=name)
        size = item.parameters.get("binary_data_size")
        if size is not None:
            inputs[name] = codec.tensor_from_raw(name, datatype, shape,
                                                 binary[offset:offset + size])
            offset += size
        else:
            inputs[name] = codec.tensor_from_json(name, datatype, shape, item.data)
    if offset != len(binary):
        raise InvalidArgument(f"{len(binary) - offset} bytes of binary data follow the last "
                              "binary input; check binary_data_size")
    binary_outputs: dict[str, bool] = {}
    requested: list[str] | None = None
    if checked.outputs is not None:
        requested = []
        for output in checked.outputs:
            requested.append(output.name)
            flag = output.parameters.get("binary_data")
            if flag is not None:
                binary_outputs[output.name] = bool(flag)
    parameters = dict(checked.parameters)
    parameters.pop("binary_data_output", None)
    request = InferenceRequest(inputs=inputs, id=checked.id,
                               parameters=parameters, requested_outputs=requested)
    return header, binary_outputs, request


def encode_infer_response(response: InferenceResponse, *, model: str, version: str,
                          binary_outputs: dict[str, bool], default_binary: bool) -> Response:
    """JSON outputs, or JSON header + raw tensors for outputs asked for in binary."""
    outputs, chunks = [], []
    for tensor in response.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                                 "shape": tensor.shape}
        if binary_outputs.get(tensor.name, default_binary):
            raw = codec.tensor_to_raw(tensor)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = codec.tensor_to_json(tensor)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outputs}
    if response.id:
        body["id"] = response.id
    if response.parameters:
        body["parameters"] = response.parameters
    header = json.dumps(body).encode()
    # the instance's measured in-flight bound, for the gateway (`backends.classic_admission`)
    headers = ({ADMISSION_BOUND: str(response.admission_bound)}
               if response.admission_bound is not None else {})
    if not chunks:
        return Response(header, media_type="application/json", headers=headers)
    return Response(b"".join([header, *chunks]), media_type="application/octet-stream",
                    headers={**headers, HEADER_LENGTH: str(len(header))})


# -- generate extension ----------------------------------------------------------------------
def generate_request(body: dict[str, Any], specs: list[Any], max_batch_size: int, *,
                     stream: bool) -> InferenceRequest:
    """Triton's generate body: top-level fields (and `parameters` entries) that name inputs
    become one-element tensors; other `parameters` stay request parameters."""
    validate.check_generate_body(body)
    by_name = {spec.name: spec for spec in specs}
    parameters = dict(body.get("parameters") or {})
    fields = {k: v for k, v in body.items() if k not in ("id", "parameters")}
    for key in list(parameters):
        if key in by_name and key not in fields:
            fields[key] = parameters.pop(key)
    if "stream" in by_name:
        fields["stream"] = stream  # the route decides, as Triton's generate_stream does
    inputs = {}
    for name, value in fields.items():
        spec = by_name.get(name)
        if spec is None:
            raise InvalidArgument(f"field {name!r} is not an input of the model (inputs: "
                                  f"{', '.join(by_name)}); put options in 'parameters'",
                                  param=name)
        values = value if isinstance(value, list) else [value]
        if spec.datatype == "BYTES":
            values = [v if isinstance(v, str) else json.dumps(v) for v in values]
        shape = [1, len(values)] if max_batch_size > 0 else [len(values)]
        inputs[name] = codec.tensor_from_json(name, spec.datatype, shape, values)
    return InferenceRequest(inputs=inputs, id=str(body.get("id", "")), parameters=parameters)


def generate_response(response: InferenceResponse, model: str, version: str) -> dict[str, Any]:
    """Outputs as top-level fields: a scalar for one element, else a flat list."""
    body: dict[str, Any] = {"model_name": model, "model_version": version}
    if response.id:
        body["id"] = response.id
    for tensor in response.outputs:
        data = codec.tensor_to_json(tensor)
        body[tensor.name] = data[0] if len(data) == 1 else data
    for key, value in response.parameters.items():  # e.g. constraint_compile_seconds
        body.setdefault(key, value)
    return body


# -- helpers ---------------------------------------------------------------------------------
async def _json_body(request: Request, limits: KServeLimits) -> dict[str, Any]:
    """A JSON object body within the limits (an empty body is `{}`)."""
    body = await read_body(request, limits)
    return loads_object(body, max_depth=limits.max_json_depth) if body.strip() else {}


__all__ = ["create_router", "encode_infer_response", "parse_infer_request"]
