"""The request path on a leased entry, the same for every frontend:
check inputs → backend → keep the requested outputs → statistics.

Every response names the version that served it (`InferenceResponse.model_version`), so a
request for the latest version learns which one answered.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.outputs import check_outputs
from podium.backends.validation import check_inputs
from podium.errors import InvalidArgument
from podium.repository.entry import ModelEntry


async def infer(entry: ModelEntry, request: InferenceRequest) -> InferenceResponse:
    """Score one request on a leased entry."""
    backend = entry.backend
    started = time.perf_counter_ns()
    ok = False
    try:
        _check(backend, request)
        response = await backend.infer(request)
        _finish(entry, request, response)
        ok = True
        return response
    finally:
        entry.stats.record(ok=ok, duration_ns=time.perf_counter_ns() - started,
                           batch_size=_batch_size(backend, request))


async def infer_stream(entry: ModelEntry, request: InferenceRequest
                       ) -> AsyncIterator[InferenceResponse]:
    """Decoupled scoring on a leased entry: every response, the last with `final` set."""
    backend = entry.backend
    started = time.perf_counter_ns()
    ok = False
    try:
        _check(backend, request)
        async for response in backend.infer_stream(request):
            _finish(entry, request, response)
            yield response
        ok = True
    finally:
        entry.stats.record(ok=ok, duration_ns=time.perf_counter_ns() - started,
                           batch_size=_batch_size(backend, request))


def statistics_row(entry: ModelEntry) -> dict[str, Any]:
    """One entry of Triton's `model_stats` list."""
    backend = entry.backend
    return entry.stats.as_triton(entry.name, entry.version,
                                 execution_count=backend.execution_count,
                                 batch_stats=backend.batch_stats())


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


def _batch_size(backend: Backend, request: InferenceRequest) -> int:
    if backend.max_batch_size > 0 and request.inputs:
        shape = next(iter(request.inputs.values())).shape
        return shape[0] if shape else 1
    return 1
