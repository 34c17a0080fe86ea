"""`--metrics-port`: /metrics on a port of its own, as Triton serves it on 8002.

The same merged exposition as `/metrics` on the HTTP port (Podium's and the engines'
metrics), followed by Triton's per-model `nv_inference_*` counters
(`repository.triton_metrics`). The same keys guard it (`--admin-key`, open with
`--metrics-open`). It opens with the HTTP port and closes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from podium.errors import BootError
from podium.server.instance import Instance

log = logging.getLogger("podium.metrics_port")


def metrics_app(instance: Instance) -> Any:
    """A FastAPI app serving only GET /metrics."""
    from fastapi import FastAPI, Response
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

    from podium.auth import ApiKeyMiddleware
    from podium.metrics.exposition import render
    from podium.repository.triton_metrics import render_triton_metrics

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        body, _ = await asyncio.to_thread(render, None)  # the directory read: off the loop
        triton = render_triton_metrics(instance.repository).encode()
        return Response(content=body + triton, media_type=CONTENT_TYPE_PLAIN_0_0_4)

    config = instance.config
    if config.access().guarded:
        app.add_middleware(ApiKeyMiddleware, access=config.access(),
                           metrics_open=config.metrics_open)
    return app


async def start_metrics_port(instance: Instance) -> tuple[Any, asyncio.Task]:
    """Serve the metrics app on --metrics-port; returns the server and its task."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the instance's own server handles the signals and stops this one

    config = instance.config
    server = QuietServer(uvicorn.Config(metrics_app(instance), host=config.host,
                                        port=config.metrics_port, log_config=None,
                                        access_log=False))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():  # a port in use: uvicorn logs it and exits
            raise BootError(f"cannot open the metrics port {config.host}:"
                            f"{config.metrics_port}; free it or choose another with "
                            "--metrics-port")
        await asyncio.sleep(0.01)
    log.info("metrics on %s:%d", config.host, config.metrics_port)
    return server, task


async def stop_metrics_port(server: Any, task: asyncio.Task) -> None:
    server.should_exit = True
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(task, 5)
