"""One `/metrics` response: podium's server metrics and every vLLM metric, merged.

In multiprocess mode (the serving path: `prepare_multiproc_dir` ran first) every value of every
process of the instance lives in the directory, podium's and vLLM's alike, so one
`MultiProcessCollector` read is the whole answer. Without the directory (a library user, a test)
the values live in memory: podium's registry plus prometheus_client's default registry, where
vLLM registers its collectors.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import ProcessCollector, generate_latest
from prometheus_client import values as _values
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics import exposition as openmetrics

from podium.metrics import server
from podium.metrics.multiproc import ENV_VAR


def multiprocess_active() -> bool:
    """True when metric values are written to the multiprocess directory."""
    return bool(getattr(_values.ValueClass, "_multiprocess", False)) and bool(
        os.environ.get(ENV_VAR)
    )


class _Merged:
    """A read-only collector over several sources, in order (what generate_latest consumes)."""

    def __init__(self, sources: Sequence[Any]) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        for source in self._sources:
            yield from source.collect()


# Process metrics of the serving process itself; the multiprocess files carry no process_*.
_process = ProcessCollector(registry=None)


def collector() -> _Merged:
    """Everything one scrape should see, for the current mode."""
    if multiprocess_active():
        return _Merged([MultiProcessCollector(None, os.environ[ENV_VAR]), _process])
    return _Merged([server.REGISTRY, DEFAULT_REGISTRY])


def wants_openmetrics(accept_header: str | None) -> bool:
    """True when the Accept header lists OpenMetrics (Prometheus sends it first, with q-values)."""
    return any(
        part.split(";")[0].strip() == "application/openmetrics-text"
        for part in (accept_header or "").split(",")
    )


def render(accept_header: str | None) -> tuple[bytes, str]:
    """(body, content type): OpenMetrics when `accept_header` asks for it, else Prometheus text."""
    if wants_openmetrics(accept_header):
        # Not prometheus_client's choose_encoder: its default OpenMetrics escaping rewrites ':'
        # to '_' in sample lines but not in TYPE lines, so every vllm:* and podium:* family
        # would come out inconsistent. All our names are legacy-valid, so ALLOWUTF8 escapes
        # nothing and the output is plain OpenMetrics 1.0.
        body = openmetrics.generate_latest(collector(), escaping=openmetrics.ALLOWUTF8)
        return body, openmetrics.CONTENT_TYPE_LATEST
    return generate_latest(collector()), CONTENT_TYPE_PLAIN_0_0_4


def create_router(dependencies: Sequence[Any] | None = None) -> APIRouter:
    """A router serving GET /metrics; pass the server's auth dependency in `dependencies`."""
    router = APIRouter(dependencies=[Depends(d) for d in dependencies or ()])

    # A plain `def`: reading the directory is blocking file I/O, so FastAPI runs it in its
    # thread pool and a scrape never stalls the event loop that streams tokens.
    @router.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        body, content_type = render(request.headers.get("accept"))
        return Response(content=body, media_type=content_type)

    return router
