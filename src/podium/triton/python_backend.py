"""Triton's `python` backend: a `model.py` with `TritonPythonModel` (`auto_complete_config`,
`initialize(args)`, `execute(requests)`, `finalize`), served with Podium's batching.

`execute` runs in a worker thread and gets a list of `pb_utils.InferenceRequest` (several when
dynamic batching groups requests, each with its own batch dimension, as in Triton). Each
`instance_group` count creates one model instance; a batch takes a free one. A decoupled model
(`model_transaction_policy { decoupled: true }`) answers through `request.get_response_sender()`
and is streamed to gRPC `ModelStreamInfer` clients.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from podium.backends.base import InferenceRequest, InferenceResponse, ModelCaller, Tensor
from podium.backends.classic import Arrays, ClassicBackend
from podium.backends.outputs import to_output_array
from podium.errors import BackendError, InvalidArgument, PackageError, PodiumError
from podium.triton import bls
from podium.triton.config import as_json
from podium.triton.model_file import install_utils, load_model_class
from podium.triton.package import TritonPackage, tensor_specs


class RequestArrays(dict):
    """A request's input arrays, queued with the id and parameters `execute` may read."""

    def __init__(self, arrays: Arrays, *, request_id: str, parameters: str,
                 correlation_id: int | str = 0) -> None:
        super().__init__(arrays)
        self.request_id, self.parameters = request_id, parameters
        self.correlation_id = correlation_id


class TritonPythonBackend(ClassicBackend):
    """A Triton Python-backend model version."""

    def __init__(self, package: TritonPackage) -> None:
        super().__init__(package)
        self.triton: TritonPackage = package
        self._config = as_json(package.config)
        self._pool: queue.Queue[Any] = queue.Queue()
        self._instances: list[Any] = []
        self._repository: ModelCaller | None = None
        self._sequences: Any = None
        """`triton.sequence.SequenceRunner` for a stateful model (`sequence_batching`)."""
        self.decoupled = package.config.model_transaction_policy.decoupled
        self._reshape = {t.name: list(t.reshape.shape)
                         for t in [*package.config.input, *package.config.output]
                         if t.HasField("reshape")}

    @property
    def platform(self) -> str:
        return "python"

    def config(self) -> dict[str, Any]:
        return self._config

    @property
    def optional_inputs(self) -> frozenset[str]:
        return frozenset(t.name for t in self.triton.config.input if t.optional)

    def bind_repository(self, repository: ModelCaller) -> None:
        self._repository = repository

    async def load(self) -> None:
        if self._repository is not None:
            bls.bind(self._repository, asyncio.get_running_loop())
        await super().load()

    def _load_model(self) -> None:
        module_name = f"podium_triton_models.{self.name}.v{self.version}".replace("-", "_")
        cls = load_model_class(self.triton.model_file, module_name)
        pb_utils = install_utils()
        if hasattr(cls, "auto_complete_config"):
            completed = cls.auto_complete_config(pb_utils.ModelConfig(self._config))
            self._config = completed.as_dict() if completed is not None else self._config
            self._adopt_completed_config()
        if not self._inputs or not self._outputs:
            raise PackageError(f"{self.triton.root}: the model declares no "
                               f"{'inputs' if not self._inputs else 'outputs'} (in "
                               "config.pbtxt or auto_complete_config)", param="input")
        count = sum(g.count or 1 for g in self.triton.config.instance_group) or 1
        for index in range(count):
            instance = cls()
            if hasattr(instance, "initialize"):
                instance.initialize({
                    "model_config": json.dumps(self._config),
                    "model_instance_kind": "CPU",
                    "model_instance_name": f"{self.name}_{index}",
                    "model_instance_device_id": "0",
                    "model_repository": str(self.triton.root),
                    "model_version": self.version,
                    "model_name": self.name,
                })
            self._instances.append(instance)
            self._pool.put(instance)
        if self.triton.config.HasField("sequence_batching"):
            from podium.triton.sequence import SequenceRunner

            self._sequences = SequenceRunner(self, len(self._instances))

    def _adopt_completed_config(self) -> None:
        from google.protobuf import json_format

        from podium.triton.config import model_config_pb2

        where = f"{self.triton.root}: auto_complete_config"
        try:
            message = json_format.ParseDict(self._config, model_config_pb2().ModelConfig())
        except json_format.ParseError as exc:
            raise PackageError(f"{where} returned an invalid config: {exc}") from None
        if message.max_batch_size != self.max_batch_size:
            raise PackageError(f"{where} sets max_batch_size={message.max_batch_size}; set it "
                               "in config.pbtxt instead", param="max_batch_size")
        self._inputs = tensor_specs(message.input, "input", where)
        self._outputs = tensor_specs(message.output, "output", where)

    # -- requests ----------------------------------------------------------------------------
    def _arrays_of(self, request: InferenceRequest) -> Arrays:
        correlation_id = request.parameters.get("sequence_id", 0)
        return RequestArrays(super()._arrays_of(request), request_id=request.id,
                             parameters=json.dumps(request.parameters, default=str),
                             correlation_id=correlation_id
                             if isinstance(correlation_id, int | str) else 0)

    def _pb_request(self, arrays: Arrays, request_id: str = "", parameters: str = "{}",
                    correlation_id: int | str = 0, flags: int = 0) -> Any:
        pb_utils = install_utils()
        tensors = []
        for name, array in arrays.items():
            if name in self._reshape:
                lead = array.shape[:1] if self.max_batch_size > 0 else ()
                array = array.reshape((*lead, *self._reshape[name]))
            tensors.append(pb_utils.Tensor(name, array))
        return pb_utils.InferenceRequest(inputs=tensors, request_id=request_id,
                                         parameters=parameters, model_name=self.name,
                                         correlation_id=correlation_id, flags=flags)

    def _execute(self, requests: list[Any]) -> Any:
        instance = self._pool.get()
        try:
            return self.execute_on(instance, requests)
        finally:
            self._pool.put(instance)

    def instance(self, index: int) -> Any:
        """The model instance `index` (a `TritonPythonModel`)."""
        return self._instances[index]

    def execute_on(self, instance: Any, requests: list[Any]) -> Any:
        """`instance.execute(requests)` (awaited when it is a coroutine), its failure as a
        BackendError."""
        try:
            result = instance.execute(requests)
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
            return result
        except PodiumError:
            raise
        except Exception as exc:
            raise BackendError(f"model {self.name!r} failed in execute: "
                               f"{type(exc).__name__}: {exc}") from exc

    def _run_batch(self, items: list[Arrays]) -> list[Arrays | Exception]:
        self.num_executions += 1
        responses = self._execute([
            self._pb_request(item, item.request_id, item.parameters, item.correlation_id)
            if isinstance(item, RequestArrays) else self._pb_request(item) for item in items])
        return self.arrays_of_responses(responses, len(items))

    def arrays_of_responses(self, responses: Any, count: int) -> list[Arrays | Exception]:
        if not isinstance(responses, list | tuple) or len(responses) != count:
            raise BackendError(f"{self.package.key}: execute must return a list of one "
                               f"response per request ({count}), got "
                               f"{type(responses).__name__}")
        return [self._arrays(response) for response in responses]

    def _arrays(self, response: Any) -> Arrays | Exception:
        """One pb_utils response as declared arrays, or the exception that fails it."""
        if response is None or not hasattr(response, "output_tensors"):
            return BackendError(f"{self.package.key}: execute returned "
                                f"{type(response).__name__}, not a pb_utils.InferenceResponse")
        if response.has_error():
            error = response.error()
            cls = InvalidArgument if error.code() == error.INVALID_ARG else BackendError
            return cls(error.message())
        declared = {spec.name: spec for spec in self._outputs}
        arrays = {}
        try:
            for tensor in response.output_tensors():
                spec = declared.get(tensor.name())
                if spec is None:
                    raise BackendError(f"{self.package.key}: execute returned output "
                                       f"{tensor.name()!r}, which config.pbtxt does not declare")
                array = to_output_array(tensor.as_numpy(), spec, package=self.package.key)
                if spec.name in self._reshape:
                    lead = array.shape[:1] if self.max_batch_size > 0 else ()
                    array = array.reshape((*lead, *spec.shape))
                arrays[spec.name] = array
        except BackendError as exc:
            return exc
        return arrays

    def _predict(self, inputs: Arrays) -> Arrays:  # pragma: no cover - _run_batch replaces it
        raise NotImplementedError

    def _release(self) -> None:
        for instance in self._instances:
            if hasattr(instance, "finalize"):
                instance.finalize()
        self._instances.clear()

    # -- decoupled ---------------------------------------------------------------------------
    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        if self._sequences is not None:
            return await self._sequences.infer(request)
        if not self.decoupled:
            return await super().infer(request)
        responses = [r async for r in self.infer_stream(request) if r.outputs]
        if len(responses) != 1:
            raise InvalidArgument(f"model {self.name!r} is decoupled and sent "
                                  f"{len(responses)} responses; use gRPC ModelStreamInfer")
        responses[0].final = True
        return responses[0]

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        if not self.decoupled:
            yield await self.infer(request)
            return
        from podium.triton.decoupled import stream

        async for response in stream(self, request):
            yield response

    def to_podium(self, response: Any, request_id: str, final: bool) -> InferenceResponse:
        """A sent pb_utils response as a Podium one (raises its error)."""
        if response is None:
            return InferenceResponse(outputs=[], id=request_id, final=final)
        arrays = self._arrays(response)
        if isinstance(arrays, Exception):
            raise arrays
        specs = {s.name: s for s in self._outputs}
        outputs = [Tensor(n, specs[n].datatype, np.asarray(a)) for n, a in arrays.items()]
        return InferenceResponse(outputs=outputs, id=request_id, final=final)
