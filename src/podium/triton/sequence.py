"""Triton's sequence batcher for stateful Python models (`sequence_batching` in config.pbtxt).

A request names its sequence with the parameters tritonclient sends (`sequence_id`,
`sequence_start`, `sequence_end`). `Sequences` is the policy, testable without a model: it
refuses a request that no sequence can take (no id, an id that was never started, one that
ended or sat idle past `max_sequence_idle_microseconds`) and pins every sequence to one model
instance for its lifetime (as Triton's `direct` strategy does, and `oldest` allows). The
backend runs one request at a time on an instance, in arrival order (an asyncio lock per
instance, which wakes its waiters first in, first out), so a sequence's requests reach the
model in order. The backend fills the model's `control_input` tensors from each `Step`
(`control_arrays`): START, END, READY (always true: Podium sends no padding requests) and
CORRID.

A new sequence when every slot is taken (instances times max(1, max_batch_size), or
`oldest.max_candidate_sequences`) is refused with 429, not held in a backlog without bound.
A start on an id that is still active ends the old sequence first, as Triton does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from podium.backends.base import InferenceRequest, InferenceResponse, Tensor
from podium.backends.outputs import check_outputs
from podium.errors import InvalidArgument, Overloaded, PackageError

if TYPE_CHECKING:
    from podium.triton.python_backend import TritonPythonBackend

DEFAULT_IDLE_US = 1_000_000_000
"""Triton's default `max_sequence_idle_microseconds` (1,000 s)."""
_CORRID_TYPES = {"TYPE_UINT64": np.uint64, "TYPE_INT64": np.int64, "TYPE_UINT32": np.uint32,
                 "TYPE_INT32": np.int32, "TYPE_STRING": np.object_}

SequenceId = int | str


@dataclass(frozen=True)
class Control:
    """One control tensor the batcher fills: its name, what it carries, its values."""

    name: str
    kind: str
    false_true: tuple[Any, Any] = (0, 1)
    dtype: Any = np.int32


@dataclass
class Sequence:
    id: SequenceId
    slot: int
    """The model instance that runs every request of this sequence."""
    last_seen: float = 0.0
    in_flight: int = 0
    ended: bool = False


@dataclass(frozen=True)
class Step:
    """One admitted request of a sequence."""

    sequence: Sequence
    start: bool
    end: bool

    @property
    def flags(self) -> int:
        """Triton's request flags (pb_utils TRITONSERVER_REQUEST_FLAG_SEQUENCE_START/END)."""
        return (1 if self.start else 0) | (2 if self.end else 0)


def read_controls(config: Any, where: str) -> list[Control]:
    """The `control_input` of a config's `sequence_batching`, each control checked."""
    from podium.triton.config import model_config_pb2

    pb2 = model_config_pb2()
    controls = []
    for control_input in config.sequence_batching.control_input:
        for control in control_input.control:
            kind = pb2.ModelSequenceBatching.Control.Kind.Name(control.kind)
            controls.append(_control(control_input.name, kind, control, pb2, where))
    return controls


def _control(name: str, kind: str, control: Any, pb2: Any, where: str) -> Control:
    field_name = "sequence_batching.control_input.control"
    if kind == "CONTROL_SEQUENCE_CORRID":
        data_type = pb2.DataType.Name(control.data_type)
        if data_type not in _CORRID_TYPES:
            raise PackageError(f"{where}: sequence_batching.control_input {name!r} (CORRID) "
                               f"has data_type "
                               f"{data_type}; use one of {', '.join(_CORRID_TYPES)}",
                               param=f"{field_name}.data_type")
        return Control(name, kind, dtype=_CORRID_TYPES[data_type])
    for values, dtype in ((control.int32_false_true, np.int32),
                          (control.fp32_false_true, np.float32),
                          (control.bool_false_true, np.bool_)):
        if values:
            if len(values) != 2:
                raise PackageError(f"{where}: sequence_batching.control_input {name!r} "
                                   f"({kind}) needs two values [false, true], got "
                                   f"{list(values)}",
                                   param=f"{field_name}.false_true")
            return Control(name, kind, (values[0], values[1]), dtype)
    raise PackageError(f"{where}: sequence_batching.control_input {name!r} ({kind}) sets "
                       "none of int32_false_true, fp32_false_true, bool_false_true",
                       param=f"{field_name}.false_true")


def control_arrays(controls: list[Control], step: Step, batched: bool
                   ) -> dict[str, np.ndarray]:
    """The control tensors of one request (shape [1], or [1, 1] with a batch dimension)."""
    arrays = {}
    for control in controls:
        if control.kind == "CONTROL_SEQUENCE_CORRID":
            value: Any = step.sequence.id
            if control.dtype is np.object_:
                value = str(value).encode()
        else:
            on = {"CONTROL_SEQUENCE_START": step.start, "CONTROL_SEQUENCE_END": step.end,
                  "CONTROL_SEQUENCE_READY": True}[control.kind]
            value = control.false_true[1 if on else 0]
        array = np.array([value], dtype=control.dtype)
        arrays[control.name] = array.reshape(1, 1) if batched else array
    return arrays


class Sequences:
    """The active sequences of one model version and the instances they are pinned to."""

    def __init__(self, model: str, num_slots: int, num_instances: int, *,
                 idle_us: int = DEFAULT_IDLE_US, string_ids: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model, self.num_slots, self.num_instances = model, num_slots, num_instances
        self.idle_s = (idle_us or DEFAULT_IDLE_US) / 1e6
        self.string_ids = string_ids
        self._clock = clock
        self._active: dict[SequenceId, Sequence] = {}

    def __len__(self) -> int:
        return len(self._active)

    def begin(self, parameters: dict[str, Any]) -> Step:
        """Admit one request: the sequence it belongs to (started now if it starts one)."""
        sequence_id = self._sequence_id(parameters.get("sequence_id"))
        start = _flag(parameters, "sequence_start")
        end = _flag(parameters, "sequence_end")
        now = self._clock()
        self._forget_idle(now)
        sequence = self._active.get(sequence_id)
        if start:
            if sequence is not None:  # Triton ends the old sequence early
                self._drop(sequence)
            sequence = self._started(sequence_id)
        elif sequence is None:
            raise InvalidArgument(
                f"sequence {sequence_id!r} of model {self.model!r} is not active: its first "
                "request must set sequence_start=true (it was never started, it ended, or it "
                f"was idle longer than max_sequence_idle_microseconds="
                f"{round(self.idle_s * 1e6)})", param="sequence_start")
        sequence.in_flight += 1
        sequence.last_seen = now
        if end:
            self._drop(sequence)  # a later request of this id must start again
        return Step(sequence, start, end)

    def finish(self, step: Step) -> None:
        """The request of `step` has its answer (or failed)."""
        step.sequence.in_flight -= 1
        step.sequence.last_seen = self._clock()

    def _sequence_id(self, value: Any) -> SequenceId:
        if value is None or value == 0 or value == "":
            raise InvalidArgument(
                f"model {self.model!r} is stateful (sequence_batching): every request needs "
                "parameters.sequence_id, a non-zero integer or non-empty string "
                "(tritonclient: infer(..., sequence_id=N, sequence_start=True))",
                param="sequence_id")
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise InvalidArgument(f"parameters.sequence_id={value!r} must be an integer or a "
                                  "string", param="sequence_id")
        if isinstance(value, int) and not 0 < value < 2**64:
            raise InvalidArgument(f"parameters.sequence_id={value} must be in 1..2^64-1",
                                  param="sequence_id")
        if isinstance(value, str) and not self.string_ids:
            raise InvalidArgument(f"parameters.sequence_id={value!r} is a string; model "
                                  f"{self.model!r} takes integer sequence ids (its CORRID "
                                  "control is not TYPE_STRING)", param="sequence_id")
        return value

    def _started(self, sequence_id: SequenceId) -> Sequence:
        if len(self._active) >= self.num_slots:
            raise Overloaded(f"model {self.model!r} has {len(self._active)} sequences active, "
                             f"all its slots ({self.num_slots}); end one (sequence_end=true) "
                             "or retry later", param="sequence_batching")
        load = [0] * self.num_instances
        for active in self._active.values():
            load[active.slot] += 1
        sequence = Sequence(sequence_id, slot=load.index(min(load)))
        self._active[sequence_id] = sequence
        return sequence

    def _drop(self, sequence: Sequence) -> None:
        sequence.ended = True
        if self._active.get(sequence.id) is sequence:
            del self._active[sequence.id]

    def _forget_idle(self, now: float) -> None:
        for sequence in list(self._active.values()):
            if sequence.in_flight == 0 and now - sequence.last_seen > self.idle_s:
                self._drop(sequence)


def _flag(parameters: dict[str, Any], name: str) -> bool:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"parameters.{name}={value!r} must be true or false",
                              param=name)
    return value


def sequences_for(config: Any, model: str, num_instances: int, where: str) -> Sequences:
    """The sequence policy of a config with `sequence_batching` (its controls read apart)."""
    settings = config.sequence_batching
    slots = num_instances * max(1, config.max_batch_size)
    if settings.WhichOneof("strategy_choice") == "oldest" and \
            settings.oldest.max_candidate_sequences > 0:
        slots = settings.oldest.max_candidate_sequences
    controls = read_controls(config, where)
    # string ids unless the model reads its CORRID as a number
    string_ids = not any(c.kind == "CONTROL_SEQUENCE_CORRID" and c.dtype is not np.object_
                         for c in controls)
    return Sequences(model, slots, num_instances,
                     idle_us=settings.max_sequence_idle_microseconds, string_ids=string_ids)


class SequenceRunner:
    """A stateful Python model's requests: admitted by `Sequences`, each run alone on the
    model instance its sequence is pinned to, with the control tensors filled in."""

    def __init__(self, backend: TritonPythonBackend, num_instances: int) -> None:
        config = backend.triton.config
        where = str(backend.triton.root / "config.pbtxt")
        self.backend = backend
        self.policy = sequences_for(config, backend.name, num_instances, where)
        self.controls = read_controls(config, where)
        self._locks = [asyncio.Lock() for _ in range(num_instances)]

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        backend = self.backend
        batched = backend.max_batch_size > 0
        step = self.policy.begin(request.parameters)
        try:
            arrays = {name: tensor.data for name, tensor in request.inputs.items()}
            arrays.update(control_arrays(self.controls, step, batched))
            pb_request = backend._pb_request(arrays, request.id,
                                             json.dumps(request.parameters, default=str),
                                             step.sequence.id, step.flags)
            slot = step.sequence.slot
            async with self._locks[slot]:
                backend.num_executions += 1
                responses = await asyncio.to_thread(
                    backend.execute_on, backend.instance(slot), [pb_request])
        finally:
            self.policy.finish(step)
        (result,) = backend.arrays_of_responses(responses, 1)
        if isinstance(result, Exception):
            raise result
        specs = backend.outputs()
        response = InferenceResponse(id=request.id, outputs=[
            Tensor(spec.name, spec.datatype, result[spec.name])
            for spec in specs if spec.name in result])
        first = next(iter(request.inputs.values()), None)
        check_outputs(response, specs, backend.max_batch_size, package=backend.package.key,
                      batch_size=first.shape[0] if batched and first is not None else None,
                      complete=True)
        return response
