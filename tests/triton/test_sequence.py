"""The sequence batcher's policy (`triton.sequence.Sequences`) on a fake clock: idle sequences
are forgotten, slots bound the sequences at once, a start on an active id restarts it, and the
control tensors carry the flags."""

from __future__ import annotations

import numpy as np
import pytest

from podium.errors import InvalidArgument, Overloaded
from podium.triton.sequence import Control, Sequences, control_arrays


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _policy(clock: Clock, **kwargs) -> Sequences:
    return Sequences("acc", kwargs.pop("num_slots", 4), kwargs.pop("num_instances", 2),
                     idle_us=kwargs.pop("idle_us", 1_000_000), clock=clock, **kwargs)


def test_a_sequence_idle_past_its_bound_must_start_again():
    clock = Clock()
    policy = _policy(clock)
    policy.finish(policy.begin({"sequence_id": 7, "sequence_start": True}))
    clock.now = 0.9
    policy.finish(policy.begin({"sequence_id": 7}))  # 0.9 s idle: still active
    clock.now = 2.0
    with pytest.raises(InvalidArgument, match="max_sequence_idle_microseconds=1000000") as caught:
        policy.begin({"sequence_id": 7})
    assert caught.value.param == "sequence_start"
    assert len(policy) == 0


def test_a_request_in_flight_keeps_its_sequence():
    clock = Clock()
    policy = _policy(clock)
    step = policy.begin({"sequence_id": 7, "sequence_start": True})
    clock.now = 5.0  # the request is still running: not idle
    policy.begin({"sequence_id": 8, "sequence_start": True})
    assert len(policy) == 2
    policy.finish(step)


def test_slots_bound_the_sequences_and_an_end_frees_one():
    policy = _policy(Clock(), num_slots=2)
    policy.begin({"sequence_id": 1, "sequence_start": True})
    policy.begin({"sequence_id": 2, "sequence_start": True})
    with pytest.raises(Overloaded) as caught:
        policy.begin({"sequence_id": 3, "sequence_start": True})
    assert caught.value.param == "sequence_batching"
    policy.begin({"sequence_id": 1, "sequence_end": True})
    assert policy.begin({"sequence_id": 3, "sequence_start": True}).start


def test_sequences_spread_over_instances_and_stay_there():
    policy = _policy(Clock(), num_slots=4, num_instances=2)
    slots = [policy.begin({"sequence_id": i, "sequence_start": True}).sequence.slot
             for i in (1, 2, 3)]
    assert slots == [0, 1, 0]
    assert policy.begin({"sequence_id": 2}).sequence.slot == 1


def test_a_start_on_an_active_id_restarts_it():
    policy = _policy(Clock(), string_ids=True)
    first = policy.begin({"sequence_id": "a", "sequence_start": True})
    again = policy.begin({"sequence_id": "a", "sequence_start": True})
    assert first.sequence.ended and not again.sequence.ended and len(policy) == 1


@pytest.mark.parametrize("parameters, field", [
    ({"sequence_id": 1, "sequence_start": "yes"}, "sequence_start"),
    ({"sequence_id": 1.5, "sequence_start": True}, "sequence_id"),
    ({"sequence_id": True, "sequence_start": True}, "sequence_id"),
    ({"sequence_id": 2**64, "sequence_start": True}, "sequence_id"),
    ({"sequence_id": 0, "sequence_start": True}, "sequence_id"),
])
def test_bad_parameters_name_the_field(parameters, field):
    with pytest.raises(InvalidArgument) as caught:
        _policy(Clock(), string_ids=True).begin(parameters)
    assert caught.value.param == field


def test_control_tensors_carry_the_flags_and_the_id():
    policy = _policy(Clock(), string_ids=True)
    controls = [Control("S", "CONTROL_SEQUENCE_START", (0.0, 1.0), np.float32),
                Control("E", "CONTROL_SEQUENCE_END", (False, True), np.bool_),
                Control("R", "CONTROL_SEQUENCE_READY"),
                Control("C", "CONTROL_SEQUENCE_CORRID", dtype=np.object_)]
    step = policy.begin({"sequence_id": "s1", "sequence_start": True, "sequence_end": True})
    arrays = control_arrays(controls, step, batched=True)
    assert arrays["S"].tolist() == [[1.0]] and arrays["S"].dtype == np.float32
    assert arrays["E"].tolist() == [[True]] and arrays["R"].tolist() == [[1]]
    assert arrays["C"].tolist() == [[b"s1"]] and step.flags == 3
