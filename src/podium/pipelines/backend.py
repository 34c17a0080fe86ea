"""The pipeline backend: a pipeline package served like any model (KServe v2 HTTP/gRPC and the
plain JSON route), its graph run by `podium.pipelines`.

Inputs carry no batch dimension (one request is one key). The response's parameters say
which experiment variant (`pipeline_variant`) and which path (`pipeline_path`: `live`, or
`cache` for a fresh answer `podium batch` precomputed) answered, and the trace id of its
spans (`pipeline_trace_id`). The caller's W3C `traceparent` comes from the HTTP header or
gRPC metadata, or a `traceparent` parameter.
"""

from __future__ import annotations

import random
from typing import Any

from podium.backends.base import Backend, InferenceRequest, InferenceResponse, ModelCaller, Tensor
from podium.backends.outputs import to_output_array
from podium.errors import InvalidArgument
from podium.metrics import request_log
from podium.package.manifest import PipelineManifest, TensorSpec


class PipelineBackend(Backend):
    """Runs a pipeline package's graph; models of the same instance are called in-process."""

    def __init__(self, package: Any) -> None:
        super().__init__(package)
        self._models: ModelCaller | None = None
        self._pipeline: Any = None

    @property
    def platform(self) -> str:
        return "podium_pipeline"

    @property
    def pipeline(self) -> Any:
        """The loaded `podium.pipelines.pipeline.Pipeline` (None before load)."""
        return self._pipeline

    def bind_repository(self, repository: ModelCaller) -> None:
        self._models = repository

    async def load(self) -> None:
        from podium.pipelines.pipeline import Pipeline

        assert isinstance(self.manifest, PipelineManifest)
        self._pipeline = Pipeline(self.manifest, self.package.root, self._models)

    async def unload(self) -> None:
        self._pipeline = None

    def inputs(self) -> list[TensorSpec]:
        return list(self.manifest.inputs)

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec(name=o.name, datatype=o.datatype, shape=o.shape)
                for o in self.manifest.outputs]

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        from podium.pipelines.tensors import scalar, to_value

        inputs = {name: scalar(to_value(tensor)) for name, tensor in request.inputs.items()}
        context = request_log.current()
        request_id = (context.request_id if context is not None else request.id
                      ) or f"{random.getrandbits(128):032x}"  # uuid4 reads urandom: slower
        unknown = sorted(set(request.parameters) - {"traceparent"})
        if unknown:
            raise InvalidArgument(f"parameter {unknown[0]!r} is not honoured by a pipeline "
                                  "(it takes only 'traceparent'); remove it",
                                  param=unknown[0])
        traceparent = request.parameters.get("traceparent")
        if traceparent is not None and not isinstance(traceparent, str):
            raise InvalidArgument("parameter 'traceparent' must be a W3C traceparent string",
                                  param="traceparent")
        if traceparent is None and context is not None:
            traceparent = context.traceparent
        result = await self._pipeline.answer(inputs, request_id, traceparent)
        outputs = []
        for spec in self.outputs():
            value = result.outputs[spec.name]
            if not isinstance(value, list):
                value = [value]
            outputs.append(Tensor(spec.name, spec.datatype,
                                  to_output_array(value, spec, package=self.package.key)))
        return InferenceResponse(outputs=outputs, id=request.id, parameters={
            "pipeline_variant": result.variant, "pipeline_path": result.path,
            "pipeline_trace_id": result.trace_id, "pipeline_request_id": request_id})
