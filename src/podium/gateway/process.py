"""`podium gateway`: the data plane's front door as its own process (HTTP + KServe gRPC).

It routes by the table its control plane sends (`follow`), so it keeps serving while the
control plane is down. `podium up` starts one or more of them (`--gateways N`) in their own
sessions: a `kill -9` of `podium up` leaves them running, and the next `podium up` adopts
them. Several gateways share one port with SO_REUSEPORT (the kernel spreads connections).

SIGTERM drains: the ports close, in-flight requests finish (gRPC ones get a grace), then the
process exits, all within `--shutdown-timeout` (a `ShutdownWatchdog` keeps the deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import uvicorn
from pydantic import ConfigDict, Field, InstanceOf

from podium import env, heap
from podium.auth import ApiKeyMiddleware
from podium.auth_keys import KeyConfig
from podium.config_flags import Flag, NotAFlag, ProcessConfig
from podium.errors import InvalidArgument
from podium.gateway.early_shed import EarlyShed
from podium.gateway.follow import ControlFollower
from podium.gateway.grpc_proxy import GrpcGateway
from podium.gateway.health import run_health_checks
from podium.gateway.http_server import bounded_head_protocol
from podium.gateway.limits import GatewayLimits
from podium.gateway.proxy import Gateway
from podium.routes.sync import ReportingStats
from podium.routes.table import RouteTable
from podium.shutdown import ShutdownWatchdog

log = logging.getLogger("podium.gateway")
GATEWAY_KEYS_ENV = env.GATEWAY_KEYS
"""JSON `{"api_keys": [...], "admin_keys": [...]}`: the literal client keys `podium up` hands
its gateways by environment (key files go by path on the command line; `env.take_gateway_keys`
reads them)."""
# longer than any client's idle expiry (httpx: 5 s): the client always closes an idle
# connection first, so a request is never sent on one the server is closing
KEEP_ALIVE_S = 75


class GatewayConfig(ProcessConfig):
    """Where one gateway process listens and which control plane it follows: one field per
    flag of `podium gateway` (`config_flags`), each with its bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    control_url: Annotated[str, Flag("--control", env=env.control_url)] = \
        env.DEFAULT_CONTROL_URL
    """The control-plane API the route table comes from (env PODIUM_CONTROL_URL)."""
    host: Annotated[str, Flag("--host")] = "0.0.0.0"
    """Interface to bind."""
    http_port: Annotated[int, Field(ge=0, le=65535, strict=True), Flag("--http-port")] = 8000
    """HTTP port (OpenAI + KServe v2)."""
    grpc_port: Annotated[int, Field(ge=-1, le=65535, strict=True), Flag("--grpc-port")] = 8001
    """KServe gRPC port; -1 disables it."""
    keys: Annotated[InstanceOf[KeyConfig], NotAFlag(
        "--api-key, --api-key-file, --admin-key, --admin-key-file: cli.KeyFlags")] = \
        Field(default_factory=KeyConfig)
    """Client keys: inference keys for the data routes, admin keys for `/metrics`."""
    credential: Annotated[str | None, NotAFlag("env PODIUM_INTERNAL_KEY")] = Field(
        default=None, repr=False)
    """The control plane's internal credential (`podium up` hands it over by environment):
    sent to instances in place of the client's key, and shown to the control API."""
    control_key: Annotated[str | None, Flag("--control-key", env=env.control_key)] = Field(
        default=None, repr=False)
    """Admin key shown to the control API when there is no credential (a gateway run by hand;
    env PODIUM_CONTROL_KEY); default its first admin key, else inference key."""
    limits: Annotated[GatewayLimits, NotAFlag(
        "gateway.limits.add_flags: one flag per field of GatewayLimits")] = Field(
        default_factory=GatewayLimits)
    """What one request may be."""
    gateway_id: Annotated[str, Flag("--id")] = ""
    """Name in the control plane's `GET /v1/gateways` (default HOST-PID)."""
    reuse_port: Annotated[bool, Field(strict=True), Flag("--reuse-port")] = False
    """Bind with SO_REUSEPORT so several gateways share the ports."""
    shutdown_timeout_s: Annotated[float, Field(ge=1, le=3600, strict=True),
                                  Flag("--shutdown-timeout", metavar="SECONDS")] = 30.0
    """SIGTERM ends the process within this many seconds (1..3600), in-flight requests
    first."""


def run_gateway(config: GatewayConfig) -> int:
    """Serve until SIGTERM / SIGINT; returns the exit code."""
    _configure_logging()
    watchdog = ShutdownWatchdog("podium gateway", config.shutdown_timeout_s)
    for sig in (signal.SIGINT, signal.SIGTERM):  # until the loop's own handlers are in
        signal.signal(sig, lambda signum, frame: watchdog.arm())
    asyncio.run(_serve(config, watchdog))
    return 0


class _Server(uvicorn.Server):
    """Signals are `_serve`'s: it stops the HTTP and the gRPC server together."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(config: GatewayConfig, watchdog: ShutdownWatchdog) -> None:
    table, stats = RouteTable(), ReportingStats()
    credential = config.credential
    gateway = Gateway(table, stats, limits=config.limits, upstream_credential=credential)
    access = config.keys.access()
    app: Any = gateway.app()
    if access.guarded:
        app = ApiKeyMiddleware(app, access=access)
    http_socket = bind(config.host, config.http_port, reuse_port=config.reuse_port)
    server = _Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                    timeout_keep_alive=KEEP_ALIVE_S,
                                    http=bounded_head_protocol(
                                        config.limits.max_header_bytes,
                                        shed=EarlyShed(gateway, access))))
    follower = ControlFollower(
        config.control_url, table, stats, api_key=credential or config.control_key,
        gateway_id=config.gateway_id or f"{socket.gethostname()}-{os.getpid()}",
        http=f"{config.host}:{config.http_port}", held=gateway.hold.counts)

    def stop() -> None:
        watchdog.arm()
        # in-flight requests get most of the budget; the rest is for gRPC and the exit
        server.config.timeout_graceful_shutdown = watchdog.remaining(
            reserve_s=min(2.0, watchdog.timeout_s / 4))
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    if watchdog.armed:
        stop()
    tasks = [asyncio.create_task(follower.run()),
             asyncio.create_task(run_health_checks(table, interval_s=2.0,
                                                   credential=credential))]
    grpc_gateway = GrpcGateway(table, stats, max_message_bytes=config.limits.max_grpc_message_bytes,
                               upstream_credential=credential,
                               max_in_flight=config.limits.max_in_flight_per_instance,
                               hold=gateway.hold)
    grpc_server = None
    if config.grpc_port >= 0:
        # grpc binds with SO_REUSEPORT unless told not to
        grpc_server, _ = await grpc_gateway.serve(config.host, config.grpc_port,
                                                  access=access, reuse_port=config.reuse_port)
    log.info("gateway %s on :%d (gRPC :%d), following %s", follower.gateway_id,
             config.http_port, config.grpc_port, config.control_url)
    freeze_heap()
    try:
        await server.serve(sockets=[http_socket])
    finally:
        stop()
        if grpc_server is not None:
            await grpc_server.stop(grace=watchdog.remaining(reserve_s=0.5))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await grpc_gateway.aclose()
        await gateway.aclose()
        log.info("gateway %s stopped", follower.gateway_id)


def freeze_heap() -> None:
    """What the start left on the heap (the imported modules: ~72,000 objects) out of the
    cyclic collector's reach (`podium.heap`), as an instance does after its boot."""
    log.info("heap frozen: %d objects out of the cyclic collector's reach", heap.freeze())


def bind(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A listening TCP socket on host:port, shared with other gateways when `reuse_port`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidArgument(f"the gateway cannot listen on {host}:{port}: {exc.strerror}; "
                              "stop what uses the port or choose another --http-port",
                              param="http_port") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _configure_logging() -> None:
    root = logging.getLogger("podium")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s", "%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
