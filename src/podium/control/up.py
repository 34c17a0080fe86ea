"""`podium up`: control plane (API on :8080) + gateway (:8000) + instances (local processes or
Ray actors), one process; one per home and per database (`plane_lock`).

The gateway and the API share one event loop; the control loop (store, process probes) runs in
its own thread. Stopping `podium up` drains and stops every instance it started, all within
`--shutdown-timeout`: a `ShutdownWatchdog` armed by the first stop signal kills what is left of
the process tree at the deadline, whatever a request or a loop pass is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import uvicorn

from podium import credential as internal_credential
from podium import env
from podium.auth import ApiKeyMiddleware
from podium.auth_keys import Access, KeyConfig
from podium.control.api import create_app
from podium.control.api_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_HEADER_BYTES
from podium.control.loop import ControlLoop, LoopConfig
from podium.control.plane import ControlPlane
from podium.control.plane_lock import PlaneLock, holder_info
from podium.control.runtime import Runtime, create_runtime
from podium.control.store import Store, default_url
from podium.control.world import RuntimeWorld
from podium.errors import InvalidArgument
from podium.gateway.grpc_proxy import GrpcGateway
from podium.gateway.health import run_health_checks
from podium.gateway.http_server import bounded_head_protocol
from podium.gateway.limits import GatewayLimits
from podium.gateway.proxy import Gateway
from podium.shutdown import ShutdownWatchdog

log = logging.getLogger("podium.control")
STOP_RESERVE_S = 1.0
"""Of the shutdown timeout, kept for closing the store and the locks after the instances."""


@dataclass(frozen=True)
class UpConfig:
    """Where `podium up` listens and keeps its state."""

    host: str = "0.0.0.0"
    """Interface the gateway and the API bind to."""
    http_port: int = 8000
    """Gateway HTTP port (OpenAI + KServe v2)."""
    grpc_port: int = 8001
    """Gateway gRPC port (KServe v2 `inference.GRPCInferenceService`); -1 disables it."""
    api_port: int = 8080
    """Control-plane REST API port."""
    database_url: str | None = None
    """SQLAlchemy URL; default a SQLite file under PODIUM_HOME."""
    home: Path | None = None
    """State directory (instance logs, default database); default PODIUM_HOME."""
    loop: LoopConfig = field(default_factory=LoopConfig)
    """Control loop timing, autoscaling and version TTL."""
    runtime: str = "local"
    """Where instances run: `local` processes or `ray` actors."""
    ray_address: str | None = None
    """HOST:PORT of the Ray head to join; None starts a local head (or uses RAY_ADDRESS)."""
    ray_num_cpus: float | None = None
    """CPUs each instance's actor reserves on Ray (default 1); Ray also sets the server's
    OMP_NUM_THREADS to it, so a CPU LLM wants several."""
    api_key: str | None = None
    """When set, the gateway (HTTP and gRPC) and the control-plane API require
    `Authorization: Bearer <key>`; liveness stays open. Added to `keys.api_keys`."""
    keys: KeyConfig = field(default_factory=KeyConfig)
    """Inference keys (the gateway) and admin keys (the control API, the gateway's /metrics),
    literal or in files re-read when changed; with no admin key, inference keys are both.
    Instances accept none of them: only the plane's internal credential."""
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    """What the gateway accepts from one request: body, headers, gRPC message, body time."""
    api_max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body the control-plane API reads (declared or sent); larger is a 413."""
    api_max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    """Largest total size of a request's headers the API takes; larger is a 431."""
    package_roots: tuple[Path, ...] = ()
    """When given, the API announces only packages under these directories."""
    shutdown_timeout_s: float = 60.0
    """SIGTERM ends `podium up` within this many seconds (1..3600): requests finish, instances
    drain and stop; at the deadline whatever is left of its process tree is killed."""

    def __post_init__(self) -> None:
        if isinstance(self.api_max_body_bytes, bool) or not (
                1024 <= self.api_max_body_bytes <= 1024**3):
            raise InvalidArgument(f"api_max_body_bytes={self.api_max_body_bytes!r} is out of "
                                  "range; use 1024..1073741824", param="api_max_body_bytes")
        if isinstance(self.api_max_header_bytes, bool) or not (
                1024 <= self.api_max_header_bytes <= 1024**2):
            raise InvalidArgument(f"api_max_header_bytes={self.api_max_header_bytes!r} is out "
                                  "of range; use 1024..1048576", param="api_max_header_bytes")
        if isinstance(self.shutdown_timeout_s, bool) or not (
                1 <= self.shutdown_timeout_s <= 3600):
            raise InvalidArgument(f"shutdown_timeout_s={self.shutdown_timeout_s!r} is out of "
                                  "range; use 1..3600 seconds", param="shutdown_timeout_s")
        for flag, paths in (("--api-key-file", self.keys.api_key_files),
                            ("--admin-key-file", self.keys.admin_key_files)):
            for path in paths:
                if not Path(path).is_file():
                    raise InvalidArgument(f"{flag} {str(path)!r} is not a file; give a file "
                                          "with one key per line", param=flag)
        if not all((*self.keys.api_keys, *self.keys.admin_keys)):
            raise InvalidArgument("an empty --api-key or --admin-key; give a non-empty key",
                                  param="api_key")
        for root in self.package_roots:
            if not root.is_dir():
                raise InvalidArgument(f"package root {str(root)!r} is not a directory",
                                      param="package_roots")

    def access(self) -> Access:
        """Per role, the keys the gateway and the control API accept."""
        keys = self.keys
        if self.api_key:
            keys = replace(keys, api_keys=(self.api_key, *keys.api_keys))
        return keys.access()


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
        _on_stop_signal(watchdog)  # until the servers run: stop as soon as they start
        store = Store.open(url)
        cleanup.callback(store.close)
        # the one key the instances accept: kept under the home, so adopted ones still do
        credential = internal_credential.load_or_create(home)
        gateway = Gateway(limits=config.limits, upstream_credential=credential)
        runtime = create_runtime(config.runtime, store, gateway.table, home / "instances",
                                 ray_address=config.ray_address,
                                 ray_num_cpus=config.ray_num_cpus, credential=credential)
        world = RuntimeWorld(runtime, gateway.table, gateway.stats)
        plane = ControlPlane(store, world)
        cleanup.callback(_stop_instances, plane, runtime, watchdog)
        loop = ControlLoop(plane, runtime, gateway.table, gateway.stats, config.loop)
        thread = threading.Thread(target=loop.run_forever, name="podium-control", daemon=True)
        thread.start()
        cleanup.callback(_stop_loop, loop, thread, watchdog)
        try:
            asyncio.run(_serve(config, plane, gateway, watchdog, credential))
        finally:
            _on_stop_signal(watchdog)  # asyncio's handlers left with its loop
            watchdog.arm()  # whatever ended serving, the rest of the stop is bounded
    return 0


def _on_stop_signal(watchdog: ShutdownWatchdog) -> None:
    """SIGTERM / SIGINT start the countdown (and `_serve` stops if it has not begun)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: watchdog.arm())


def _stop_loop(loop: ControlLoop, thread: threading.Thread, watchdog: ShutdownWatchdog) -> None:
    loop.stop()
    thread.join(timeout=watchdog.remaining(reserve_s=watchdog.timeout_s / 2))


def _stop_instances(plane: ControlPlane, runtime: Runtime, watchdog: ShutdownWatchdog) -> None:
    # a loop pass stuck past its share must not keep the instances running
    locked = plane.lock.acquire(timeout=watchdog.remaining(reserve_s=watchdog.timeout_s / 2))
    if not locked:
        log.warning("a control-loop pass still runs; stopping the instances anyway")
    try:
        runtime.close(timeout_s=watchdog.remaining(reserve_s=STOP_RESERVE_S))
    finally:
        if locked:
            plane.lock.release()


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to `_serve`: two servers each installing their own
    handlers would re-raise SIGTERM into a default handler and skip the instances' shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


# Longer than any client's idle expiry (httpx: 5 s, uvicorn's own default): the client always
# closes an idle connection first, so a request is never sent on one the server is closing
KEEP_ALIVE_S = 75


async def _serve(config: UpConfig, plane: ControlPlane, gateway: Gateway,
                 watchdog: ShutdownWatchdog, credential: str) -> None:
    access = config.access()
    gateway_app: Any = gateway.app()
    if access.guarded:
        gateway_app = ApiKeyMiddleware(gateway_app, access=access)
    servers = [
        _Server(uvicorn.Config(gateway_app, host=config.host, port=config.http_port,
                               log_level="warning", access_log=False,
                               timeout_keep_alive=KEEP_ALIVE_S,
                               http=bounded_head_protocol(config.limits.max_header_bytes))),
        _Server(uvicorn.Config(create_app(plane, access=access,
                                          max_body_bytes=config.api_max_body_bytes,
                                          max_header_bytes=config.api_max_header_bytes,
                                          package_roots=config.package_roots),
                               host=config.host,
                               http=bounded_head_protocol(config.api_max_header_bytes,
                                                          server="the control API",
                                                          flag="--api-max-header-bytes"),
                               port=config.api_port,
                               log_level="info")),
    ]

    def stop_all() -> None:
        watchdog.arm()
        for server in servers:
            # counted by uvicorn from now: in-flight requests get a quarter of the budget,
            # draining and stopping the instances the rest
            server.config.timeout_graceful_shutdown = watchdog.remaining(
                reserve_s=watchdog.timeout_s * 3 / 4)
            server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_all)
    if watchdog.armed:  # told to stop before the servers ran
        stop_all()
    # the gateway's own active probes cover the gap between two control-loop passes
    health = asyncio.create_task(run_health_checks(gateway.table, interval_s=2.0,
                                                   credential=credential))
    grpc_gateway = GrpcGateway(gateway.table, gateway.stats,
                               max_message_bytes=config.limits.max_grpc_message_bytes,
                               upstream_credential=credential,
                               max_in_flight=config.limits.max_in_flight_per_instance)
    grpc_server = None
    if config.grpc_port >= 0:
        grpc_server, _ = await grpc_gateway.serve(config.host, config.grpc_port, access=access)
    log.info("gateway on :%d (gRPC :%d), control-plane API on :%d", config.http_port,
             config.grpc_port, config.api_port)
    try:
        await asyncio.gather(*(s.serve() for s in servers))
    finally:
        stop_all()
        health.cancel()
        if grpc_server is not None:
            await grpc_server.stop(grace=min(5.0, watchdog.remaining(
                reserve_s=watchdog.timeout_s * 3 / 4)))
        await grpc_gateway.aclose()
