"""Run one instance: HTTP (uvicorn) and gRPC ports open at once, boot in the background,
graceful shutdown on SIGTERM / SIGINT.

Shutdown order: readiness turns false (gateways stop routing) → the ports stop accepting →
in-flight requests finish within `shutdown_timeout_s` → models unload (the engine's processes
are reaped) → exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

from podium.server.config import ServerConfig
from podium.server.instance import Instance

log = logging.getLogger("podium.serve")
# Longer than clients' idle expiry (httpx and the gateway: 5 s): the client closes an idle
# connection first, so no request is ever written to a connection the server is closing.
KEEP_ALIVE_S = 75


def run_server(config: ServerConfig) -> int:
    """Serve until told to stop; the exit code is non-zero when boot failed."""
    from podium import env
    from podium.server.logs import configure_logging

    env.force_offline()
    _prepare_metrics_dir()  # before anything imports prometheus_client
    configure_logging(config.log_format, config.log_level)
    instance = Instance(config)
    if not config.api_key:
        log.warning("no API key configured: every route is open (use --api-key or "
                    "PODIUM_API_KEY)")
    # uvicorn re-raises the stop signal after its graceful exit; with a handler of ours in
    # place that re-raise lands here instead of killing the process, so a clean drain exits 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    return asyncio.run(_serve(instance))


async def _serve(instance: Instance) -> int:
    import uvicorn

    from podium.server.app import build_app

    server: uvicorn.Server | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        instance.stop = lambda: setattr(server, "should_exit", True)
        grpc_server = await _start_grpc(instance)
        instance.boot_task = asyncio.create_task(_boot_or_exit(instance, server))
        try:
            yield
        finally:
            await _shutdown(instance, grpc_server)

    config = instance.config
    app = build_app(instance, lifespan=lifespan)
    server = _draining_server(instance, uvicorn_config(app, config))
    log.info("HTTP on %s:%d, gRPC on %s", config.host, config.http_port,
             config.grpc_port if config.grpc_port >= 0 else "off")
    await server.serve()
    return 1 if instance.boot_error else 0  # boot failed, or an engine died


def uvicorn_config(app: Any, config: ServerConfig) -> Any:
    """How uvicorn serves the instance's HTTP port; request heads are bounded (431)."""
    import uvicorn

    from podium.gateway.http_server import bounded_head_protocol

    return uvicorn.Config(
        app, host=config.host, port=config.http_port, log_config=None,
        timeout_graceful_shutdown=config.shutdown_timeout_s, access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=bounded_head_protocol(config.max_header_bytes, server="the instance",
                                   flag="--max-header-bytes"))


def _draining_server(instance: Instance, config: Any) -> Any:
    """A uvicorn.Server that turns readiness off the moment a stop signal arrives."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not instance.draining:
                log.info("signal %d: draining (no new requests; in-flight ones finish "
                         "within %.0fs)", sig, instance.config.shutdown_timeout_s)
            instance.draining = True
            from podium.metrics.server import set_ready

            set_ready(False)
            super().handle_exit(sig, frame)

    return DrainingServer(config)


async def _boot_or_exit(instance: Instance, server: Any) -> None:
    from podium.server.boot import boot

    try:
        await boot(instance)
    except asyncio.CancelledError:
        return
    except BaseException:
        log.error("stopping: the instance cannot serve (see the boot error above)")
        server.should_exit = True
        return
    await _watch_engines(instance, server)


async def _watch_engines(instance: Instance, server: Any, interval_s: float = 1.0) -> None:
    """Poll the engines; one found dead stops the instance through the repository's
    dead-engine hook (`Instance._engine_died`), as a request that met a dead engine does."""
    while not server.should_exit:
        await asyncio.sleep(interval_s)
        instance.repository.check_alive()


async def _start_grpc(instance: Instance) -> Any:
    port = instance.config.grpc_port
    if port < 0:
        return None
    from podium.frontends.kserve_grpc import create_server

    grpc_server = create_server(instance.repository, port=port,
                                server_ready=instance.is_ready, host=instance.config.host,
                                api_key=instance.config.api_key)
    await grpc_server.start()
    return grpc_server


async def _shutdown(instance: Instance, grpc_server: Any) -> None:
    instance.draining = True
    task = instance.boot_task
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    if grpc_server is not None:
        await grpc_server.stop(instance.config.shutdown_timeout_s)
    # HTTP requests have finished (uvicorn waited for them); gRPC ones were given the grace.
    await instance.repository.unload_all(timeout_s=instance.config.shutdown_timeout_s)
    log.info("stopped")


def _prepare_metrics_dir() -> None:
    from podium.metrics.multiproc import prepare_multiproc_dir

    prepare_multiproc_dir()  # idempotent: `podium serve` already claimed it in podium.cli
