"""The plain JSON route of pipelines: `POST /pipelines/{name}[/versions/{v}]`.

Body: the pipeline's inputs by name (`{"member_id": "42"}`); answer: its outputs by name plus
which variant and path answered, the trace id and the request id. The same repository path as
KServe infer (lease → checks → backend), so any model answers here too, though pipelines are
what it is for. Errors are Triton-shaped (`{"error": "..."}`), as on `/v2`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from podium.backends.base import Backend, InferenceRequest, Tensor
from podium.backends.datatypes import NUMPY_DTYPES
from podium.errors import InvalidArgument, Unavailable
from podium.errors.http import error_response
from podium.frontends.disconnect import cancel_on_disconnect
from podium.frontends.kserve_limits import KServeLimits, read_body
from podium.frontends.safe_json import loads_object
from podium.metrics import request_log
from podium.repository import ModelRepository


class _PipelineRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            request_log.annotate(protocol="kserve_http", endpoint=self.path)
            try:
                return await handler(request)
            except Exception as exc:
                return error_response("kserve", exc)

        return guarded


def create_router(repository: ModelRepository, *, server_ready: Callable[[], bool],
                  limits: KServeLimits | None = None) -> APIRouter:
    """`POST /pipelines/{name}` and its versioned form."""
    limits = limits or KServeLimits()
    router = APIRouter(route_class=_PipelineRoute)

    async def run(name: str, request: Request, version: str | None = None) -> Response:
        if not server_ready():
            raise Unavailable("the instance is not ready yet")
        body = loads_object(await read_body(request, limits), max_depth=limits.max_json_depth)
        answer = await cancel_on_disconnect(request, repository.infer(
            name, version, lambda backend: _request(body, backend)))
        if isinstance(answer, Response):  # the client left; the work was cancelled
            return answer
        outputs = {t.name: _json_value(t) for t in answer.outputs}
        params = answer.parameters
        return JSONResponse({
            "model_name": name, "model_version": answer.model_version, "outputs": outputs,
            "variant": params.get("pipeline_variant"), "path": params.get("pipeline_path"),
            "trace_id": params.get("pipeline_trace_id"),
            "request_id": params.get("pipeline_request_id")})

    router.add_api_route("/pipelines/{name}", run, methods=["POST"])
    router.add_api_route("/pipelines/{name}/versions/{version}", run, methods=["POST"])
    return router


def _request(body: dict[str, Any], backend: Backend) -> InferenceRequest:
    specs = {spec.name: spec for spec in backend.inputs()}
    unknown = sorted(set(body) - set(specs))
    if unknown:
        raise InvalidArgument(f"field {unknown[0]!r} is not an input of {backend.name!r} "
                              f"(inputs: {', '.join(specs)})", param=unknown[0])
    tensors = {}
    for name, value in body.items():
        spec = specs[name]
        array = np.asarray(value if isinstance(value, list) else [value])
        if spec.datatype == "BYTES":
            if array.dtype.kind not in "USO" or any(not isinstance(v, str) for v in array.flat):
                raise InvalidArgument(f"field {name!r} must be a string (or a list of strings)"
                                      f", got {value!r}", param=name)
            data = np.empty(array.shape, dtype=object)
            data.flat[:] = [v.encode() for v in array.flat]
        else:
            try:
                data = array.astype(NUMPY_DTYPES[spec.datatype])
            except (ValueError, TypeError):
                raise InvalidArgument(f"field {name!r} must be {spec.datatype}, got {value!r}",
                                      param=name) from None
        tensors[name] = Tensor(name, spec.datatype, data)
    return InferenceRequest(inputs=tensors)


def _json_value(tensor: Tensor) -> Any:
    if tensor.datatype == "BYTES":
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                for v in tensor.data.reshape(-1)]
    return tensor.data.tolist()
