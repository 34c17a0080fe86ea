"""Business-logic scripting: a Python model's `pb_utils.InferenceRequest(...).exec()` scores a
model Podium serves, through the repository of the instance (bound when a Python model loads).

`execute` runs in a worker thread; the call is handed to the instance's event loop and the
thread waits for it. An error comes back as a response carrying a `TritonError`, as in Triton.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from podium.backends.base import InferenceRequest, InferenceResponse, ModelCaller, Tensor
from podium.backends.datatypes import datatype_of
from podium.errors import InvalidArgument, PodiumError

_bound: dict[str, Any] = {}


def bind(repository: ModelCaller, loop: asyncio.AbstractEventLoop) -> None:
    """The repository BLS calls go through (one per process), and its event loop."""
    _bound["repository"], _bound["loop"] = repository, loop


def _podium_request(request: Any) -> InferenceRequest:
    tensors = {}
    for tensor in request.inputs():
        array = np.asarray(tensor.as_numpy())
        datatype = datatype_of(array.dtype)
        if datatype is None:
            raise ValueError(f"input {tensor.name()!r}: numpy dtype {array.dtype} has no "
                             "KServe datatype")
        tensors[tensor.name()] = Tensor(tensor.name(), datatype, array)
    parameters = {}
    if request.correlation_id() not in (0, ""):  # a call into a stateful model's sequence
        flags = request.flags()
        parameters = {"sequence_id": request.correlation_id(),
                      "sequence_start": bool(flags & 1), "sequence_end": bool(flags & 2)}
    return InferenceRequest(inputs=tensors, id=request.request_id(), parameters=parameters,
                            requested_outputs=request.requested_output_names() or None)


def _coroutine(request: Any) -> Any:
    if "repository" not in _bound:
        raise RuntimeError("BLS is only available inside a model Podium serves")
    version = request._model_version
    version = None if version in (-1, None, "") else str(version)
    return _bound["repository"].infer(request.model_name(), version, _podium_request(request))


def _convert(result: InferenceResponse | BaseException, response_cls: type, error_cls: type,
             tensor_cls: type) -> Any:
    if isinstance(result, BaseException):
        message = result.message if isinstance(result, PodiumError) else \
            f"{type(result).__name__}: {result}"
        code = error_cls.INVALID_ARG if isinstance(result, InvalidArgument) else \
            error_cls.INTERNAL
        return response_cls(error=error_cls(message, code))
    return response_cls(output_tensors=[tensor_cls(t.name, t.data) for t in result.outputs])


def call_model(request: Any, response_cls: type, error_cls: type, tensor_cls: type) -> Any:
    """Run `request` on its model and wait (from a worker thread)."""
    try:
        future = asyncio.run_coroutine_threadsafe(_coroutine(request), _bound["loop"])
        result: Any = future.result(request._timeout_us / 1e6 or None)
    except Exception as exc:  # the response carries it, as Triton's exec() does
        result = exc
    return _convert(result, response_cls, error_cls, tensor_cls)


def call_model_async(request: Any, response_cls: type, error_cls: type, tensor_cls: type
                     ) -> Any:
    """The same, awaitable from a model's own event loop (an `async def execute`)."""

    async def run() -> Any:
        try:
            future = asyncio.run_coroutine_threadsafe(_coroutine(request), _bound["loop"])
            result: Any = await asyncio.wrap_future(future)
        except Exception as exc:
            result = exc
        return _convert(result, response_cls, error_cls, tensor_cls)

    return asyncio.ensure_future(run())
