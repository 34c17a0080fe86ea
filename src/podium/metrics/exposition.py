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
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import ProcessCollector
from prometheus_client import values as _values
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from podium.metrics import server
from podium.metrics.multiproc import ENV_VAR

if TYPE_CHECKING:
    from fastapi import APIRouter


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


def render(accept_header: str | None) -> tuple[bytes, str]:
    """(body, content type): OpenMetrics when `accept_header` asks for it, else Prometheus text."""
    encoder, content_type = choose_encoder(accept_header or "")
    return encoder(collector()), content_type


def create_router(dependencies: Sequence[Any] | None = None) -> APIRouter:
    """A router serving GET /metrics; pass the server's auth dependency in `dependencies`."""
    from fastapi import APIRouter, Depends, Request, Response

    router = APIRouter(dependencies=[Depends(d) for d in dependencies or ()])

    # A plain `def`: reading the directory is blocking file I/O, so FastAPI runs it in its
    # thread pool and a scrape never stalls the event loop that streams tokens.
    @router.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        body, content_type = render(request.headers.get("accept"))
        return Response(content=body, media_type=content_type)

    return router
