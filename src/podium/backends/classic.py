"""What xgboost, torch and onnx share: in-process scoring of numpy tensors with dynamic batching.

A subclass loads its model (`_load_model`, in a worker thread), may derive its I/O from it
(`_derive_io`), and scores one already-concatenated batch (`_predict`). This class concatenates
concurrent requests along the batch dimension, runs the model off the event loop, and splits
the results back. It also measures the instance's completions per busy second and derives the
in-flight bound the gateway admits to from it (`classic_admission`), sent on every answer.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any

import numpy as np

from podium.backends import classic_admission
from podium.backends.base import Backend, InferenceRequest, InferenceResponse, Tensor
from podium.backends.batching import (
    DEFAULT_MAX_QUEUE,
    DEFAULT_QUEUE_TIMEOUT_S,
    BatchingConfig,
    DynamicBatcher,
    batch_stats,
)
from podium.backends.limits import resolve
from podium.backends.outputs import check_outputs, to_output_array
from podium.errors import BackendError, Overloaded, PackageError, PodiumError
from podium.package.manifest import TensorSpec

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]


class ClassicBackend(Backend):
    """Base of the in-process backends that take and return fixed sets of tensors."""

    def __init__(self, package: Any) -> None:
        super().__init__(package)
        self._inputs: list[TensorSpec] = list(self.manifest.inputs or [])
        self._outputs: list[TensorSpec] = list(self.manifest.outputs or [])
        self._batcher: DynamicBatcher[Arrays, Arrays] | None = None
        self.num_executions = 0
        self._max_in_flight = DEFAULT_MAX_QUEUE
        """Without a batcher: most requests in flight at once (the max_queue bound)."""
        self._num_in_flight = 0
        self.admission = classic_admission.ClassicAdmission(
            classic_admission.DEFAULT_TARGET_WAIT_S, DEFAULT_MAX_QUEUE, "default")
        """The in-flight bound measured on this instance (replaced at load)."""

    # -- subclass hooks ------------------------------------------------------------------------
    @abc.abstractmethod
    def _load_model(self) -> None:
        """Load the model file (runs in a worker thread)."""

    def _derive_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """Inputs and outputs read from the loaded model, for manifests that omit them."""
        raise PackageError(f"{self.package.root}: the {self.manifest.backend} backend cannot "
                           "derive inputs/outputs from this model; declare them in podium.json")

    @abc.abstractmethod
    def _predict(self, inputs: Arrays) -> Arrays:
        """Score one batch: every output keyed by its declared name (runs in a worker thread)."""

    def _release(self) -> None:
        """Drop the model (runs in a worker thread)."""

    # -- Backend -------------------------------------------------------------------------------
    async def load(self) -> None:
        await asyncio.to_thread(self._load_model)
        if not self._inputs or not self._outputs:
            derived_inputs, derived_outputs = self._derive_io()
            self._inputs = self._inputs or derived_inputs
            self._outputs = self._outputs or derived_outputs
        settings = self.manifest.dynamic_batching
        limits = self.limits
        self._max_in_flight = resolve(limits.max_queue, settings and settings.max_queue,
                                      DEFAULT_MAX_QUEUE)
        if settings is not None and self.max_batch_size > 0:
            config = BatchingConfig(
                max_batch_size=self.max_batch_size,
                max_queue_delay_s=settings.max_queue_delay_us / 1e6,
                preferred_batch_sizes=tuple(settings.preferred_batch_sizes),
                max_queue=resolve(limits.max_queue, settings.max_queue, DEFAULT_MAX_QUEUE),
                queue_timeout_s=resolve(limits.queue_timeout_ms, settings.queue_timeout_ms,
                                        round(DEFAULT_QUEUE_TIMEOUT_S * 1000)) / 1000)
            self._batcher = DynamicBatcher(self._run_batch, config, size_of=_batch_size,
                                           signature_of=_signature, name=self.name,
                                           version=self.version)
        self.admission = self._admission()
        log.info("%s", self.admission.describe(self.package.key))

    def _admission(self) -> classic_admission.ClassicAdmission:
        """The measured bound's settings: the target wait (the flag's, else the package's,
        else the default) and the ceiling (the queue plus one batch)."""
        flag = self.limits.classic_target_wait_s
        package = getattr(self.manifest, "admission_target_wait_s", None)
        target, source = ((flag, "flag") if flag is not None else
                          (package, "package") if package is not None else
                          (classic_admission.DEFAULT_TARGET_WAIT_S, "default"))
        ceiling = self._max_in_flight + max(1, self.max_batch_size)
        return classic_admission.ClassicAdmission(target, ceiling, source)

    async def unload(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
            self._batcher = None
        await asyncio.to_thread(self._release)

    def inputs(self) -> list[TensorSpec]:
        return self._inputs

    def outputs(self) -> list[TensorSpec]:
        return self._outputs

    def _arrays_of(self, request: InferenceRequest) -> Arrays:
        """What the batcher queues for a request: its input arrays by name."""
        return {name: tensor.data for name, tensor in request.inputs.items()}

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        arrays = self._arrays_of(request)
        admission = self.admission
        since = admission.busy.started()
        done = False
        try:
            if self._batcher is not None:
                result = await self._batcher.submit(arrays)
            else:
                result = await self._run_unbatched(arrays)
            done = True
        except Exception as exc:  # a model's failure took its time; a refusal took none
            done = not isinstance(exc, Overloaded)
            raise
        finally:
            if admission.finished(completed=done, since=since):
                log.info("%s", admission.describe(self.package.key))
        outputs = [Tensor(spec.name, spec.datatype, result[spec.name]) for spec in self._outputs]
        response = InferenceResponse(outputs=outputs, id=request.id,
                                     admission_bound=admission.bound)
        check_outputs(response, self._outputs, self.max_batch_size, package=self.package.key,
                      batch_size=_batch_size(arrays) if self.max_batch_size > 0 else None,
                      complete=True)
        return response

    async def _run_unbatched(self, arrays: Arrays) -> Arrays:
        """One request, one model call in a worker thread; bounded like a batcher's queue."""
        if self._num_in_flight >= self._max_in_flight:
            raise Overloaded(f"model {self.package.key} is overloaded: {self._num_in_flight} "
                             f"requests are in flight (max_queue={self._max_in_flight}); retry "
                             "later, or raise max_queue in the manifest or `podium serve "
                             "--max-queue`", param="max_queue")
        self._num_in_flight += 1
        try:
            (result,) = await asyncio.to_thread(self._run_batch, [arrays])
        finally:
            self._num_in_flight -= 1
        if isinstance(result, Exception):
            raise result
        return result

    def is_alive(self) -> bool:
        return self._batcher is None or self._batcher.is_alive()

    def config(self) -> dict[str, Any]:
        """Triton's model configuration, with the measured in-flight bound (`admission`)."""
        return {**super().config(), "admission": self.admission.as_dict()}

    def batch_stats(self) -> list[dict[str, Any]]:
        """Triton-style per-batch-size statistics of the dynamic batcher."""
        return batch_stats(self._batcher)

    @property
    def execution_count(self) -> int:
        """Model calls made (several requests may share one)."""
        return self._batcher.num_executions if self._batcher is not None else self.num_executions

    # -- batching ------------------------------------------------------------------------------
    def _run_batch(self, items: list[Arrays]) -> list[Arrays | Exception]:
        """One model call for `items`: their outputs, or an exception per item that failed."""
        self.num_executions += 1
        if len(items) == 1:
            return [self._checked_predict(items[0])]
        names = list(items[0])
        merged = {name: np.concatenate([item[name] for item in items]) for name in names}
        outputs = self._checked_predict(merged)
        sizes = [_batch_size(item) for item in items]
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != sum(sizes):
                raise BackendError(f"{self.package.key}: output {name!r} has shape "
                                   f"{list(array.shape)} for a batch of {sum(sizes)} rows; its "
                                   "first dimension must be the batch size")
        bounds = np.cumsum(sizes)[:-1]
        split = {name: np.split(array, bounds) for name, array in outputs.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(items))]

    def _checked_predict(self, inputs: Arrays) -> Arrays:
        try:
            outputs = self._predict(inputs)
        except PodiumError:
            raise
        except Exception as exc:  # the model's own failure: this request fails, we keep serving
            raise BackendError(f"model {self.name!r} failed: {type(exc).__name__}: {exc}") from exc
        for spec in self._outputs:
            if spec.name not in outputs:
                raise BackendError(f"{self.package.key} produced no output {spec.name!r}")
            outputs[spec.name] = to_output_array(outputs[spec.name], spec,
                                                 package=self.package.key)
        return outputs


def _batch_size(arrays: Arrays) -> int:
    return int(next(iter(arrays.values())).shape[0]) if arrays else 1


def _signature(arrays: Arrays) -> tuple[Any, ...]:
    # requests concatenate only when every non-batch dimension agrees
    return tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(arrays.items()))
