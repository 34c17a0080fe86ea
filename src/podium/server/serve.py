"""Run one instance: the HTTP port (uvicorn) opens at once, for liveness, and boot runs in the
background; the gRPC port opens as boot's last step, once every model is loaded; graceful
shutdown on SIGTERM / SIGINT.

Shutdown order: readiness turns false (gateways stop routing) → the ports stop accepting →
in-flight requests finish → models unload (the engine's processes are reaped) → exit. The whole
stop is bounded by `shutdown_timeout_s`: requests get all of it but `UNLOAD_RESERVE_S`, and a
`ShutdownWatchdog` armed by the first stop signal kills the process tree at the deadline, so a
model whose `initialize` or `execute` hangs cannot keep the process alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

from podium.errors import BootError
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from podium.shutdown import ShutdownWatchdog

log = logging.getLogger("podium.serve")
UNLOAD_RESERVE_S = 5.0
"""Of the shutdown timeout, at most this much (a quarter of it when shorter) is kept for
unloading models after the in-flight requests."""
# Longer than clients' idle expiry (httpx and the gateway: 5 s): the client closes an idle
# connection first, so no request is ever written to a connection the server is closing.
KEEP_ALIVE_S = 75


def run_server(config: ServerConfig) -> int:
    """Serve until told to stop; the exit code is non-zero when boot failed."""
    from podium import env
    from podium.server.logs import configure_logging

    env.force_offline()
    try:
        env.constraint_compiler()  # now, not at the first constrained request (a 500 there)
    except ValueError as exc:
        raise BootError(str(exc)) from None
    _prepare_metrics_dir()  # before anything imports prometheus_client
    configure_logging(config.log_format, config.log_level)
    instance = Instance(config)
    watchdog = ShutdownWatchdog("podium serve", config.shutdown_timeout_s)
    if not config.access().guarded:
        log.warning("no API key configured: every route is open (use --api-key, "
                    "--api-key-file or PODIUM_API_KEY; --admin-key for the admin routes)")
    # a signal before uvicorn listens (or uvicorn's re-raise after its graceful exit) lands
    # here: it starts the countdown instead of killing the process, so a clean drain exits 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: watchdog.arm())
    return asyncio.run(_serve(instance, watchdog))


async def _serve(instance: Instance, watchdog: ShutdownWatchdog) -> int:
    import uvicorn

    from podium.server.app import build_app
    from podium.server.loop_lag import probe_loop_lag

    server: uvicorn.Server | None = None

    def stop() -> None:
        watchdog.arm()
        server.should_exit = True  # type: ignore[union-attr]

    grpc_servers: list[Any] = []

    async def open_grpc_port() -> None:
        grpc_servers.append(await _start_grpc(instance))

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        instance.stop = stop
        instance.open_ports = open_grpc_port if instance.config.grpc_port >= 0 else None
        metrics_port = None
        if instance.config.metrics_port is not None:
            from podium.server.metrics_port import start_metrics_port

            metrics_port = await start_metrics_port(instance)
        instance.boot_task = asyncio.create_task(_boot_or_exit(instance, server))
        lag_probe = asyncio.create_task(probe_loop_lag())
        try:
            yield
        finally:
            lag_probe.cancel()
            if metrics_port is not None:
                from podium.server.metrics_port import stop_metrics_port

                await stop_metrics_port(*metrics_port)
            watchdog.arm()  # a stop for any reason (signal, dead engine, failed boot)
            await _shutdown(instance, grpc_servers[0] if grpc_servers else None, watchdog)

    config = instance.config
    instance.frontends = None  # boot mounts /v1 (or refuses it) once it has read the packages
    app = build_app(instance, lifespan=lifespan)
    server = _draining_server(instance, watchdog, uvicorn_config(
        app, config, timeout_graceful_shutdown=watchdog.remaining(_unload_reserve(config)),
        instance=instance))
    server.should_exit = watchdog.armed  # told to stop while starting: stop at once
    log.info("HTTP on %s:%d (liveness now, inference once ready); gRPC %s", config.host,
             config.http_port, f"on {config.grpc_port} once ready" if config.grpc_port >= 0
             else "off")
    await server.serve()
    return 1 if instance.boot_error else 0  # boot failed, or an engine died


def uvicorn_config(app: Any, config: ServerConfig, *,
                   timeout_graceful_shutdown: float | None = None,
                   instance: Instance | None = None) -> Any:
    """How uvicorn serves the instance's HTTP port; request heads are bounded (431); with
    `instance`, an OpenAI request to its full engine is refused from its head
    (`server.early_shed`)."""
    import uvicorn

    from podium.edge.early import early_answer_protocol
    from podium.edge.head import bounded_head_protocol
    from podium.server.early_shed import InstanceShed, answered

    protocol = bounded_head_protocol(config.max_header_bytes, server="the instance",
                                     flag="--max-header-bytes")
    if instance is not None:
        protocol = early_answer_protocol(protocol, InstanceShed(instance),
                                         answered)  # type: ignore[arg-type]
    return uvicorn.Config(
        app, host=config.host, port=config.http_port, log_config=None,
        timeout_graceful_shutdown=timeout_graceful_shutdown, access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S, http=protocol)


def _unload_reserve(config: ServerConfig) -> float:
    return min(UNLOAD_RESERVE_S, config.shutdown_timeout_s / 4)


def _draining_server(instance: Instance, watchdog: ShutdownWatchdog, config: Any) -> Any:
    """A uvicorn.Server that turns readiness off and starts the shutdown countdown the moment
    a stop signal arrives."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            watchdog.arm()
            # uvicorn counts its graceful timeout from now, when the countdown just began
            self.config.timeout_graceful_shutdown = watchdog.remaining(
                _unload_reserve(instance.config))
            if not instance.draining:
                log.info("signal %d: draining (no new requests; in-flight ones finish "
                         "within %.1fs, all of it within %.1fs)", sig,
                         self.config.timeout_graceful_shutdown, watchdog.timeout_s)
            instance.draining = True
            from podium.metrics.server import set_ready

            # not here: this runs between two bytecodes of whatever the main thread was doing,
            # and a request recording a metric holds prometheus_client's (non-reentrant)
            # lock, which set_ready needs: the shutdown then deadlocked until the watchdog
            try:
                asyncio.get_running_loop().call_soon(set_ready, False)
            except RuntimeError:  # no loop running (yet): nothing can hold the lock
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
    interval = instance.repository.control.poll_interval_s
    if interval is not None:
        from podium.server.repository_poll import poll_forever

        await asyncio.gather(_watch_engines(instance, server),
                             poll_forever(instance, server, interval))
        return
    await _watch_engines(instance, server)


async def _watch_engines(instance: Instance, server: Any, interval_s: float = 1.0) -> None:
    """Poll the engines; one found dead stops the instance through the repository's
    dead-engine hook (`Instance._engine_died`), as a request that met a dead engine does."""
    while not server.should_exit:
        await asyncio.sleep(interval_s)
        instance.repository.check_alive()


async def _start_grpc(instance: Instance) -> Any:
    from podium.frontends.kserve_grpc import create_server

    config = instance.config
    try:
        grpc_server = create_server(instance.repository, port=config.grpc_port,
                                    server_ready=instance.is_ready, host=config.host,
                                    access=config.access(), limits=config.kserve_limits)
    except RuntimeError as exc:  # grpc: "Failed to bind to address ..."
        raise BootError(f"cannot open the gRPC port {config.host}:{config.grpc_port} "
                        f"({exc}); free it or choose another with --grpc-port") from None
    await grpc_server.start()
    log.info("gRPC on %s:%d", config.host, config.grpc_port)
    return grpc_server


async def _shutdown(instance: Instance, grpc_server: Any, watchdog: ShutdownWatchdog) -> None:
    instance.draining = True
    reserve = _unload_reserve(instance.config)
    task = instance.boot_task
    if task is not None and not task.done():
        task.cancel()
        # a boot step running in a thread (a hung `initialize`) cannot be cancelled: wait
        # for it no longer than the countdown allows
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, watchdog.remaining(reserve))
    if grpc_server is not None:
        await grpc_server.stop(watchdog.remaining(reserve))
    # HTTP requests have finished (uvicorn waited for them); gRPC ones were given the grace.
    await instance.repository.unload_all(timeout_s=watchdog.remaining(reserve))
    log.info("stopped")


def _prepare_metrics_dir() -> None:
    from podium.metrics.multiproc import prepare_multiproc_dir

    prepare_multiproc_dir()  # idempotent: `podium serve` already claimed it in podium.cli
