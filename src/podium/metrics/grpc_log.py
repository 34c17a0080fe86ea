"""The gRPC side of request logs and metrics: one `async with` per RPC in the KServe servicer.

    async def ModelInfer(self, request, context):
        async with track_grpc(context, "ModelInfer") as call:
            annotate(model=request.model_name, version=request.model_version or "")
            ...

It takes the client's `x-request-id` metadata (or makes one), sends it back in the initial
metadata, and when the RPC ends writes the request log line and counts it in
`podium:requests_total` / `podium:request_duration_seconds` with protocol `kserve_grpc`,
endpoint = the method name and code = the gRPC status name.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from podium.errors.render import bind_request_id, kind_of
from podium.metrics import request_log


@asynccontextmanager
async def track_grpc(context: Any, method: str) -> AsyncIterator[request_log.RequestContext]:
    """Request id, log line and metrics for one RPC served under `context`."""
    import grpc

    metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ())}
    incoming = metadata.get(request_log.HEADER)
    call = request_log.RequestContext(
        request_id=request_log.request_id_from(incoming if isinstance(incoming, str) else None),
        method="RPC",
        path=method,
        protocol="kserve_grpc",
        endpoint=method,
        traceparent=metadata.get("traceparent") if isinstance(metadata.get("traceparent"), str)
        else None,
    )
    token = request_log._current.set(call)
    # not unbound: the error interceptor, outside this block, names the id in a 500's message
    bind_request_id(call.request_id)
    await context.send_initial_metadata(((request_log.HEADER, call.request_id),))
    try:
        yield call
        # a stream's failed request (its `error_message`, the call still OK) set its own code
        call.status = _code_name(context.code()) or call.status or "OK"
    except BaseException as exc:
        # context.abort() raises after setting the code; an exception raised instead is
        # rendered by the error interceptor, with the code its class maps to
        call.status = _code_name(context.code()) or _fault(exc, grpc)
        raise
    finally:
        request_log._current.reset(token)
        call.latency_s = time.perf_counter() - call.started
        request_log.log_request(call)
        from podium.metrics import server

        server.observe_request(
            "kserve_grpc",
            method,
            call.model or "",
            call.version or "",
            str(call.status),
            call.latency_s,
        )


def _code_name(code: Any) -> str | None:
    return getattr(code, "name", None)


def _fault(exc: BaseException, grpc: Any) -> str:
    import asyncio

    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED.name
    return kind_of(exc).grpc_code
