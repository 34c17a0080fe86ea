"""`podium up`: control plane (API on :8080) + gateway processes (:8000 HTTP, :8001 gRPC) +
instances (local processes or Ray actors); one per home and per database (`plane_lock`).

With regions declared (`--region`, `--regions-file`), each region gets its own runtime, its own
gateway processes on its own ports (following `API/regions/NAME`) and its own route table; its
state lives under `$PODIUM_HOME/regions/NAME/`. Without, one region `default` is exactly the
single-region plane.

The data plane never runs in this process: `--gateways N` gateway processes (`podium
gateway`, `control.gateways`) share the gateway ports and route by the table this process
publishes (`control.gateway_feed`); they and the instances live in their own sessions, so a
`kill -9` of `podium up` leaves traffic flowing on the last table, and the next `podium up`
adopts them. The API runs on the event loop; the control loop (store, process probes) in its
own thread. Stopping `podium up` drains the gateways (in-flight requests finish), then drains
and stops every instance it started, all within `--shutdown-timeout`: a `ShutdownWatchdog`
armed by the first stop signal kills what is left of the process tree at the deadline,
whatever a request or a loop pass is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

from podium import credential as internal_credential
from podium import env
from podium.control.adapter_deploy import AdapterIndex
from podium.control.api import create_app
from podium.control.engine_api import add_engine_routes
from podium.control.engine_figures import EngineFigures
from podium.control.gateway_api import QuietSync, add_gateway_routes
from podium.control.loop import ControlLoop
from podium.control.pipeline_figures import PipelineFigures, add_pipeline_routes
from podium.control.plane import ControlPlane
from podium.control.plane_lock import PlaneLock, holder_info
from podium.control.region_world import Region, RegionWorlds
from podium.control.runtime import create_runtime
from podium.control.store import Store, default_url
from podium.control.up_config import UpConfig
from podium.control.up_region import RegionServed, region_specs
from podium.control.up_stop import (
    on_stop_signal,
    stop_gateways,
    stop_instances,
    stop_loop,
    stop_self,
)
from podium.edge.head import bounded_head_protocol
from podium.shutdown import ShutdownWatchdog

log = logging.getLogger("podium.control")


def run_up(config: UpConfig) -> int:
    """Serve until interrupted; returns the exit code."""
    home = config.home or env.home()
    url = config.database_url or default_url(home)
    watchdog = ShutdownWatchdog("podium up", config.shutdown_timeout_s)
    with contextlib.ExitStack() as cleanup:  # undone in reverse, each step bounded by the watchdog
        # before anything else: a second plane must not adopt (and then stop) the first one's
        # instances, nor write a row
        lock = PlaneLock.acquire(home, url, holder_info(
            host=config.host, http_port=config.http_port, grpc_port=config.grpc_port,
            api_port=config.api_port))
        cleanup.callback(lock.release)
        on_stop_signal(watchdog)  # until the servers run: stop as soon as they start
        store = Store.open(url)
        cleanup.callback(store.close)
        store.set_regions(list(config.regions))  # none declared: the one `default` region
        # the one key the instances accept: kept under the home, so adopted ones still do
        credential = internal_credential.load_or_create(home)
        served = [RegionServed.build(config, spec, home, store, credential, declared)
                  for spec, declared in region_specs(config)]
        for part in served:
            # before any instance is adopted: a refusal must leave them running
            part.gateways.adopt(host=config.host, port=part.spec.http_port)
        regions = []
        for part in served:
            runtime, address = ((part.spec.runtime, part.spec.ray_address) if config.regions
                                else (config.runtime, config.ray_address))
            part.runtime = create_runtime(
                runtime, store.for_region(part.spec.name) if config.regions else store,
                part.table, part.home / "instances", ray_address=address,
                ray_num_cpus=config.ray_num_cpus, credential=credential)
            regions.append(Region(part.spec.name, part.runtime, part.table, part.stats))
        plane = ControlPlane(store, RegionWorlds(regions, base_of=AdapterIndex(store).base_of))
        first = regions[0]
        loop = ControlLoop(plane, first.runtime, first.table, first.stats, config.loop,
                           feeds=[p.feed for p in served],
                           gateways=[p.gateways for p in served], regions=regions,
                           plane_lock=lock, on_deposed=stop_self)
        cleanup.callback(lambda: None if loop.deposed else stop_instances(
            plane, [r.runtime for r in regions], watchdog))  # deposed: the new holder's now
        thread = threading.Thread(target=loop.run_forever, name="podium-control", daemon=True)
        # adopted gateways keep their table until the loop's first pass has rebuilt this one
        for part in served:
            part.gateways.start()
        cleanup.callback(stop_gateways, served, watchdog)  # first to stop: they drain
        thread.start()
        cleanup.callback(stop_loop, loop, thread, watchdog)
        try:
            asyncio.run(_serve(config, plane, served, watchdog, credential))
        finally:
            on_stop_signal(watchdog)  # asyncio's handlers left with its loop
            watchdog.arm()  # whatever ended serving, the rest of the stop is bounded
    return 2 if loop.deposed else 0


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to `_serve`: two servers each installing their own
    handlers would re-raise SIGTERM into a default handler and skip the instances' shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(config: UpConfig, plane: ControlPlane, served: list[RegionServed],
                 watchdog: ShutdownWatchdog, credential: str) -> None:
    # the gateways follow the plane with its credential: it opens the admin routes too
    app = create_app(plane, access=config.access(internal_key=credential),
                     max_body_bytes=config.api_max_body_bytes,
                     package_roots=config.package_roots)
    # the console's LLM figures: the instances' /metrics, read with the key they accept
    probe = httpx.Client(timeout=2.0, headers=internal_credential.bearer(credential))
    for part in served:
        add_gateway_routes(app, part.feed, prefix=part.prefix)
        assert part.runtime is not None
        add_engine_routes(app, plane.store, EngineFigures(part.runtime.instances, probe),
                          region=part.spec.name, prefix=part.prefix)
        add_pipeline_routes(app, plane.store, PipelineFigures(part.runtime.instances, probe),
                            region=part.spec.name, prefix=part.prefix)
    if served[0].prefix:  # regions declared: `podium gateways` lists every region's

        @app.get("/v1/gateways")
        def all_gateways() -> list[dict[str, Any]]:
            return [{"region": p.spec.name, **g} for p in served for g in p.feed.gateways()]
    server = _Server(uvicorn.Config(app, host=config.host, port=config.api_port,
                                    http=bounded_head_protocol(config.api_max_header_bytes,
                                                               server="the control API",
                                                               flag="--api-max-header-bytes"),
                                    log_level="info"))
    logging.getLogger("uvicorn.access").addFilter(QuietSync())  # after uvicorn set logging up

    def stop() -> None:
        watchdog.arm()
        for part in served:
            part.gateways.terminate()  # they drain meanwhile, on their own clock
        # counted by uvicorn from now: API requests get a quarter of the budget, draining
        # the gateways and the instances the rest
        server.config.timeout_graceful_shutdown = watchdog.remaining(
            reserve_s=watchdog.timeout_s * 3 / 4)
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    if watchdog.armed:  # told to stop before the server ran
        stop()
    for part in served:
        log.info("control-plane API on :%d; region %s: %d gateway process(es) on :%d "
                 "(gRPC :%d)", config.api_port, part.spec.name, config.num_gateways,
                 part.spec.http_port, part.spec.grpc_port)
    try:
        await server.serve()
    finally:
        stop()
