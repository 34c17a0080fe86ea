"""The request path on a leased entry, the same for every frontend:
room → build and check inputs → backend → keep the requested outputs → statistics.

Room comes first: a full engine's refusal (`Backend.refusal`, the 429 / RESOURCE_EXHAUSTED the
instance answers from an HTTP request's head, `server.early_shed`) is raised before the request
is built, so a frontend that hands over a builder (`RequestFor`: gRPC's decode, KServe
generate's tensors) has nothing decoded, checked or tokenized for a refusal. A request with bad
inputs sent to a full engine is therefore refused (429) rather than told its 400, as on the
HTTP routes. The refusal is counted as a failed request of the leased entry, a LoRA adapter's
own (its backend asks its base's engine).

Every response names the version that served it (`InferenceResponse.model_version`), so a
request for the latest version learns which one answered.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.outputs import check_outputs
from podium.backends.validation import check_inputs
from podium.errors import InvalidArgument
from podium.repository.entry import ModelEntry

RequestFor = Callable[[Backend], InferenceRequest]
"""Builds a request once the version is resolved and the engine has room (generate needs the
model's inputs; gRPC decodes only then)."""


async def infer(entry: ModelEntry, request: InferenceRequest | RequestFor
                ) -> InferenceResponse:
    """Score one request on a leased entry."""
    backend = entry.backend
    started = time.perf_counter_ns()
    ok = False
    built: InferenceRequest | None = None
    try:
        built = _admit(backend, request)
        response = await backend.infer(built)
        _finish(entry, built, response)
        ok = True
        return response
    finally:
        entry.stats.record(ok=ok, duration_ns=time.perf_counter_ns() - started,
                           batch_size=_batch_size(backend, built))


async def infer_stream(entry: ModelEntry, request: InferenceRequest | RequestFor
                       ) -> AsyncIterator[InferenceResponse]:
    """Decoupled scoring on a leased entry: every response, the last with `final` set."""
    backend = entry.backend
    started = time.perf_counter_ns()
    ok = False
    built: InferenceRequest | None = None
    try:
        built = _admit(backend, request)
        async for response in backend.infer_stream(built):
            _finish(entry, built, response)
            yield response
        ok = True
    finally:
        entry.stats.record(ok=ok, duration_ns=time.perf_counter_ns() - started,
                           batch_size=_batch_size(backend, built))


def statistics_row(entry: ModelEntry) -> dict[str, Any]:
    """One entry of Triton's `model_stats` list."""
    backend = entry.backend
    return entry.stats.as_triton(entry.name, entry.version,
                                 execution_count=backend.execution_count,
                                 batch_stats=backend.batch_stats())


def _admit(backend: Backend, request: InferenceRequest | RequestFor) -> InferenceRequest:
    """The request, built and checked, once the backend has room for it; its refusal first."""
    if (refusal := backend.refusal()) is not None:
        raise refusal  # nothing decoded or tokenized: a refusal costs the engine's check
    built = request if isinstance(request, InferenceRequest) else request(backend)
    _check(backend, built)
    return built


def _check(backend: Backend, request: InferenceRequest) -> None:
    check_inputs(request, backend.inputs(), backend.max_batch_size,
                 optional=backend.optional_inputs)
    if request.requested_outputs is not None:
        names = {spec.name for spec in backend.outputs()}
        for output in request.requested_outputs:
            if output not in names:
                raise InvalidArgument(f"requested output {output!r} is not an output of model "
                                      f"{backend.name!r} (outputs: {', '.join(sorted(names))})",
                                      param=output)


def _finish(entry: ModelEntry, request: InferenceRequest, response: InferenceResponse) -> None:
    # every backend's answer matches its declared outputs (a decoupled part may carry some)
    backend = entry.backend
    check_outputs(response, backend.outputs(), backend.max_batch_size, package=entry.key,
                  batch_size=_batch_size(backend, request) if backend.max_batch_size else None)
    response.model_version = entry.version
    if request.requested_outputs is not None:
        wanted = set(request.requested_outputs)
        response.outputs = [t for t in response.outputs if t.name in wanted]


def _batch_size(backend: Backend, request: InferenceRequest | None) -> int:
    if backend.max_batch_size > 0 and request is not None and request.inputs:
        shape = next(iter(request.inputs.values())).shape
        return shape[0] if shape else 1
    return 1
