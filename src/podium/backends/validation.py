"""Checks of a request against a model's declared inputs, shared by every caller of a backend.

The repository runs them before a backend sees a request, so HTTP, gRPC and python-backend
ensembles reject the same things with the same messages (naming the input and the fix).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from podium.backends.base import InferenceRequest
from podium.errors import InvalidArgument
from podium.package.manifest import TensorSpec


def check_inputs(request: InferenceRequest, specs: Sequence[TensorSpec], max_batch_size: int,
                 *, optional: Iterable[str] = ()) -> None:
    """Reject missing, unknown, mistyped or misshapen inputs, naming the input and the fix."""
    by_name = {spec.name: spec for spec in specs}
    optional = set(optional)
    for name in request.inputs:
        if name not in by_name:
            raise InvalidArgument(f"unexpected input {name!r}; the model takes "
                                  f"{', '.join(by_name) or 'no inputs'}", param=name)
    batch_sizes: set[int] = set()
    for spec in specs:
        tensor = request.inputs.get(spec.name)
        if tensor is None:
            if spec.name in optional:
                continue
            raise InvalidArgument(f"input {spec.name!r} is missing; the model expects "
                                  f"{spec.datatype} {expected_shape(spec, max_batch_size)}",
                                  param=spec.name)
        if tensor.datatype != spec.datatype:
            raise InvalidArgument(f"input {spec.name!r} has datatype {tensor.datatype} but the "
                                  f"model expects {spec.datatype}", param=spec.name)
        expected = expected_shape(spec, max_batch_size)
        if not _shape_matches(tensor.shape, expected):
            raise InvalidArgument(f"input {spec.name!r} has shape {tensor.shape} but the model "
                                  f"expects {expected} (-1: any size)", param=spec.name)
        if max_batch_size > 0:
            batch = tensor.shape[0]
            if batch == 0:
                raise InvalidArgument(f"input {spec.name!r} has shape {tensor.shape}: an empty "
                                      "batch; send at least one row", param=spec.name)
            if batch > max_batch_size:
                raise InvalidArgument(f"input {spec.name!r} has batch size {batch}, over the "
                                      f"model's max_batch_size of {max_batch_size}; split the "
                                      "request", param=spec.name)
            batch_sizes.add(batch)
    if len(batch_sizes) > 1:
        raise InvalidArgument(f"inputs disagree on the batch size ({sorted(batch_sizes)}); "
                              "every input needs the same first dimension")


def expected_shape(spec: TensorSpec, max_batch_size: int) -> list[int]:
    """The shape clients send: the declared shape behind a -1 batch dimension when batching."""
    return [-1, *spec.shape] if max_batch_size > 0 else list(spec.shape)


def _shape_matches(shape: Sequence[int], expected: Sequence[int]) -> bool:
    return len(shape) == len(expected) and all(e == -1 or s == e
                                               for s, e in zip(shape, expected, strict=True))
