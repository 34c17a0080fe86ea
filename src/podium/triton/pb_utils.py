"""`triton_python_backend_utils`, as Podium provides it to Triton Python-backend models.

A model's `import triton_python_backend_utils as pb_utils` gets this module (registered in
`sys.modules` under that name before the model's `model.py` is loaded). It follows Triton's
documented python_backend API; what is covered and what is not is listed in docs/triton.md.
Requests reach `execute` as `InferenceRequest`s; `InferenceRequest(model_name=...).exec()` calls
any model Podium serves (BLS) through the repository the serving backend registered.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from podium.triton.bls import call_model, call_model_async

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1

_log = logging.getLogger("podium.triton.model")

_NUMPY = {"TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
          "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
          "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
          "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
          "TYPE_STRING": np.object_}


class TritonModelException(Exception):
    """Raised by the utilities (e.g. a BLS call that failed when asked to raise)."""


class TritonError:
    """An error carried by an `InferenceResponse`; it fails that request."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, \
        CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message, self._code = str(message), code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r})"


class Tensor:
    """A named numpy tensor (CPU memory only)."""

    def __init__(self, name: str, array: Any) -> None:
        if not isinstance(array, np.ndarray):
            raise TritonModelException(f"Tensor {name!r}: expected a numpy array, got "
                                       f"{type(array).__name__}")
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        return cls(name, np.from_dlpack(capsule))


class InferenceResponse:
    """What `execute` returns per request (or a response sender sends): outputs or an error."""

    def __init__(self, output_tensors: list[Tensor] | None = None,
                 error: TritonError | None = None, parameters: dict | str | None = None
                 ) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) else \
            json.dumps(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """A decoupled model's sender: `send(response, flags=...)`, any number of times."""

    def __init__(self, deliver: Callable[[InferenceResponse | None, int], None]) -> None:
        self._deliver = deliver
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("this response sender already sent its final flag")
        if response is None and flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException("send(None) needs flags=TRITONSERVER_RESPONSE_"
                                       "COMPLETE_FINAL")
        self._closed = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._deliver(response, flags)

    def is_cancelled(self) -> bool:
        return False


class InferenceRequest:
    """A request handed to `execute`, or built by a model to call another model (BLS)."""

    def __init__(self, model_name: str = "", requested_output_names: list[str] | None = None,
                 inputs: list[Tensor] | None = None, model_version: int = -1, flags: int = 0,
                 correlation_id: int | str = 0, request_id: str = "", timeout: int = 0,
                 parameters: dict | str | None = None, **_: Any) -> None:
        self._model_name, self._model_version = model_name, model_version
        self._requested = list(requested_output_names or [])
        self._inputs = list(inputs or [])
        self._flags, self._correlation_id, self._request_id = flags, correlation_id, request_id
        self._parameters = parameters if isinstance(parameters, str) else \
            json.dumps(parameters or {})
        self._sender: InferenceResponseSender | None = None
        self._timeout_us = timeout

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as Triton gives them."""
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested

    def model_name(self) -> str:
        return self._model_name

    def is_cancelled(self) -> bool:
        return False

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("get_response_sender() is for decoupled models "
                                       "(model_transaction_policy { decoupled: true })")
        return self._sender

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """BLS: run this request on `model_name` and wait for its response."""
        if decoupled:
            raise TritonModelException("exec(decoupled=True) is not supported by Podium")
        return call_model(self, InferenceResponse, TritonError, Tensor)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future:
        """BLS from an `async def execute`: an awaitable of the response."""
        if decoupled:
            raise TritonModelException("async_exec(decoupled=True) is not supported by Podium")
        return call_model_async(self, InferenceResponse, TritonError, Tensor)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((c for c in model_config.get("input", []) if c.get("name") == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((c for c in model_config.get("output", []) if c.get("name") == name), None)


def triton_string_to_numpy(triton_type: str) -> Any:
    """`"TYPE_FP32"` → `numpy.float32` (TYPE_STRING → object)."""
    return _NUMPY.get(triton_type)


def numpy_to_triton_type(dtype: Any) -> str | None:
    """`numpy.float32` → `"TYPE_FP32"`."""
    kind = np.dtype(dtype)
    if kind.kind in "OSU":
        return "TYPE_STRING"
    return next((t for t, n in _NUMPY.items() if n is not np.object_ and np.dtype(n) == kind),
                None)


class Logger:
    """Triton's model logger, written to Podium's log (`podium.triton.model`)."""

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


class ModelConfig:
    """What `auto_complete_config(auto_complete_model_config)` receives and returns."""

    def __init__(self, config: dict) -> None:
        self._config = config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, size: int) -> None:
        self._config["max_batch_size"] = int(size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, policy: dict) -> None:
        self._config["model_transaction_policy"] = dict(policy)

    def add_input(self, spec: dict) -> None:
        self._add("input", spec)

    def add_output(self, spec: dict) -> None:
        self._add("output", spec)

    def _add(self, field: str, spec: dict) -> None:
        tensors = self._config.setdefault(field, [])
        for existing in tensors:
            if existing.get("name") == spec.get("name"):
                return  # the config's own declaration wins, as in Triton when they agree
        tensors.append(dict(spec))
