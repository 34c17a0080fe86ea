"""One region of `podium up`: its route table and feed, its gateway processes (their command
line, secrets and share of the shutdown), then its runtime (`up.run_up` creates it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from podium import credential as internal_credential
from podium.control.gateway_feed import PublishedTable, RouteFeed
from podium.control.gateways import GatewayProcesses
from podium.control.region_config import RegionSpec
from podium.control.runtime import Runtime
from podium.control.store import Store
from podium.control.up_config import UpConfig
from podium.gateway.limits import to_flags
from podium.gateway.process import GATEWAY_KEYS_ENV
from podium.routes.stats import VersionStats


class RegionServed:
    """What `podium up` runs for one region: its table and feed, gateways, then runtime."""

    def __init__(self, spec: RegionSpec, home: Path, prefix: str, gateways: GatewayProcesses,
                 table: PublishedTable, stats: VersionStats, feed: RouteFeed) -> None:
        self.spec, self.home, self.prefix = spec, home, prefix
        self.gateways, self.table, self.stats, self.feed = gateways, table, stats, feed
        self.runtime: Runtime | None = None

    @classmethod
    def build(cls, config: UpConfig, spec: RegionSpec, home: Path, store: Store,
              credential: str, declared: bool) -> RegionServed:
        """A region's table, feed and gateway processes (not started yet)."""
        table, stats = PublishedTable(), VersionStats()
        feed = table.feed = RouteFeed(table, stats)
        where = home / "regions" / spec.name if declared else home
        prefix = f"/regions/{spec.name}" if declared else ""
        names = [f"gateway-{i}" if not declared else f"{spec.name}-gateway-{i}"
                 for i in range(config.num_gateways)]
        gateways = GatewayProcesses(
            where, [gateway_command(config, name, region=spec if declared else None)
                    for name in names],
            secrets=gateway_secrets(config, credential),
            note=lambda message: store.record_event("gateway", message))
        return cls(spec, where, prefix, gateways, table, stats, feed)


def region_specs(config: UpConfig) -> list[tuple[RegionSpec, bool]]:
    """The regions to run, and whether they were declared (else: the implicit default)."""
    if config.regions:
        return [(spec, True) for spec in config.regions]
    # its runtime comes from --runtime / --ray-address, checked by create_runtime itself
    return [(RegionSpec(http_port=config.http_port, grpc_port=config.grpc_port), False)]


def gateway_command(config: UpConfig, name: str, *,
                    region: RegionSpec | None = None) -> list[str]:
    """The `podium gateway` command line of one of this plane's gateways (of one region's,
    on its ports, following its part of the API)."""
    api_host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    if ":" in api_host:
        api_host = f"[{api_host}]"
    control = f"http://{api_host}:{config.api_port}"
    http_port, grpc_port = config.http_port, config.grpc_port
    if region is not None:
        control += f"/regions/{region.name}"
        http_port, grpc_port = region.http_port, region.grpc_port
    return [sys.executable, "-m", "podium.cli", "gateway",
            "--control", control, "--id", name,
            "--host", config.host, "--http-port", str(http_port),
            "--grpc-port", str(grpc_port), "--reuse-port",
            "--shutdown-timeout", f"{gateway_shutdown_s(config):g}", *to_flags(config.limits),
            *(arg for path in config.keys.api_key_files for arg in ("--api-key-file", str(path))),
            *(arg for path in config.keys.admin_key_files
              for arg in ("--admin-key-file", str(path)))]


def gateway_secrets(config: UpConfig, credential: str) -> dict[str, str]:
    """What a gateway process gets by environment, never on its command line: the plane's
    credential (for the instances and the control API) and the literal client keys."""
    keys = config.key_config()
    return {internal_credential.ENV: credential,
            GATEWAY_KEYS_ENV: json.dumps({"api_keys": list(keys.api_keys),
                                          "admin_keys": list(keys.admin_keys)})}


def gateway_shutdown_s(config: UpConfig) -> float:
    """A gateway's share of the shutdown (told at its first moment): half, most of it for
    in-flight requests; the instances they run on are stopped in the other half."""
    return max(1.0, config.shutdown_timeout_s / 2)
