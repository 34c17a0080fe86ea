"""Regions as an operator declares them: `podium up --region ...` flags or a TOML/JSON file.

Each region has its own runtime (local processes, or the Ray cluster at an address) and its own
gateway (HTTP and gRPC ports). The order they are declared in is the order rollouts go through
them unless a deployment names its own. A plane that declares none has one region, `default`,
on the `--runtime` and gateway ports of `podium up` itself: exactly the single-region plane.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.control.actions import DEFAULT_REGION
from podium.control.rollout_config import REGION_NAME
from podium.errors import InvalidArgument

RUNTIMES = ("local", "ray")
KEYS = ("name", "runtime", "ray_address", "http_port", "grpc_port")


@dataclass(frozen=True)
class RegionSpec:
    """One region: a name, where its instances run, where its gateway listens."""

    name: str = DEFAULT_REGION
    runtime: str = "local"
    """`local` processes or `ray` actors."""
    ray_address: str | None = None
    """HOST:PORT of the region's Ray head (with `runtime="ray"`); None: a local head."""
    http_port: int = 8000
    grpc_port: int = 8001
    """-1 disables the region's gateway gRPC port."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not REGION_NAME.match(self.name):
            raise InvalidArgument(f"region name {self.name!r} must be lowercase letters, "
                                  "digits, '.', '_' or '-' (e.g. eu-west)", param="region")
        if self.runtime not in RUNTIMES:
            raise InvalidArgument(f"region {self.name}: runtime {self.runtime!r} is not one of "
                                  f"{', '.join(RUNTIMES)}", param="runtime")
        if self.ray_address is not None and self.runtime != "ray":
            raise InvalidArgument(f"region {self.name}: ray_address needs runtime=ray",
                                  param="ray_address")
        for key, low in (("http_port", 0), ("grpc_port", -1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    low <= value <= 65535):
                raise InvalidArgument(f"region {self.name}: {key}={value!r} is out of range; "
                                      f"use 1..65535{' or -1' if low < 0 else ''}", param=key)


def parse_flag(text: str) -> RegionSpec:
    """`name=eu,http=8000,grpc=8001[,runtime=ray][,ray-address=HOST:PORT]` → a region."""
    fields: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        key = {"http": "http_port", "grpc": "grpc_port"}.get(key, key.replace("-", "_"))
        if not sep or key not in KEYS:
            raise InvalidArgument(f"--region {text!r}: {part!r} is not KEY=VALUE with KEY one "
                                  "of name, http, grpc, runtime, ray-address", param="region")
        fields[key] = value
    for key in ("http_port", "grpc_port"):
        if key in fields:
            try:
                fields[key] = int(fields[key])
            except ValueError:
                raise InvalidArgument(f"--region {text!r}: {key} must be a port number",
                                      param="region") from None
    if "name" not in fields:
        raise InvalidArgument(f"--region {text!r} has no name=...", param="region")
    return RegionSpec(**fields)


def load_file(path: Path) -> list[RegionSpec]:
    """Regions from a `.toml` (`[[region]]` tables) or `.json` (`{"regions": [...]}`) file."""
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"--regions-file {str(path)!r} cannot be read: {exc}",
                              param="regions_file") from None
    entries = data.get("region", data.get("regions")) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidArgument(f"--regions-file {str(path)!r} must hold a list of regions "
                              "(`[[region]]` in TOML, `\"regions\": [...]` in JSON)",
                              param="regions_file")
    specs = []
    for entry in entries:
        unknown = sorted(set(entry) - set(KEYS))
        if unknown:
            raise InvalidArgument(f"--regions-file {str(path)!r}: {unknown[0]!r} is not a "
                                  f"region field; use {', '.join(KEYS)}", param="regions_file")
        specs.append(RegionSpec(**entry))
    return specs


def check_regions(specs: list[RegionSpec], *, api_port: int) -> None:
    """Distinct names and ports (no two gateways on one port), one Ray cluster at most."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidArgument(f"region {dup!r} is declared twice", param="region")
    ports = [p for s in specs for p in (s.http_port, s.grpc_port) if p > 0] + [api_port]
    if len(set(ports)) != len(ports):
        dup = next(p for p in ports if ports.count(p) > 1)
        raise InvalidArgument(f"port {dup} is given to two gateways (or to a gateway and the "
                              "API); give each region its own http and grpc ports",
                              param="region")
    addresses = {s.ray_address for s in specs if s.runtime == "ray"}
    if len(addresses) > 1:
        # Ray joins one cluster per process: two addresses cannot both be served from here
        raise InvalidArgument(f"regions on Ray name {len(addresses)} clusters "
                              f"({', '.join(sorted(str(a) for a in addresses))}); one control "
                              "plane joins one Ray cluster: give them the same ray_address",
                              param="ray_address")
