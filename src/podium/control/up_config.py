"""`UpConfig`: what `podium up` was asked to do, one field per flag (`config_flags`), each with
its bounds; a bad value is refused on construction naming the flag and the bound."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, InstanceOf, model_validator

from podium import env
from podium.auth_keys import Access, KeyConfig
from podium.config_flags import Flag, NotAFlag, ProcessConfig
from podium.control.api_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_HEADER_BYTES
from podium.control.loop import LoopConfig
from podium.control.region_config import RegionSpec, check_regions
from podium.errors import InvalidArgument
from podium.gateway.limits import GatewayLimits

KEY_FLAGS = "--api-key, --api-key-file, --admin-key, --admin-key-file: cli.KeyFlags"


def _version_ttl(seconds: float) -> LoopConfig:
    return LoopConfig(version_ttl_ms=int(seconds * 1000))


class UpConfig(ProcessConfig):
    """Where `podium up` listens and keeps its state."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    host: Annotated[str, Flag("--host")] = "0.0.0.0"
    """Interface the gateways and the API bind to."""
    num_gateways: Annotated[int, Field(ge=0, le=16, strict=True),
                            Flag("--gateways", metavar="N")] = 1
    """Gateway processes sharing the gateway ports (0..16; 0: none, run `podium gateway`
    yourself)."""
    http_port: Annotated[int, Field(ge=0, le=65535, strict=True), Flag("--http-port")] = 8000
    """Gateway HTTP port (OpenAI + KServe v2)."""
    grpc_port: Annotated[int, Field(ge=-1, le=65535, strict=True), Flag("--grpc-port")] = 8001
    """Gateway gRPC port (KServe v2 `inference.GRPCInferenceService`); -1 disables it."""
    api_port: Annotated[int, Field(ge=0, le=65535, strict=True), Flag("--api-port")] = 8080
    """Control-plane REST API port."""
    database_url: Annotated[str | None, Flag("--database", env=env.database_url)] = None
    """SQLAlchemy URL (env PODIUM_DATABASE_URL); default a SQLite file under PODIUM_HOME."""
    home: Annotated[Path | None, NotAFlag("env PODIUM_HOME")] = None
    """State directory (instance logs, default database); default PODIUM_HOME."""
    loop: Annotated[InstanceOf[LoopConfig], Flag(
        "--version-ttl", metavar="SECONDS", type=float, parse=_version_ttl, default=3600.0,
        help="seconds before an idle versioned deployment is stopped")] = Field(
        default_factory=LoopConfig)
    """Control loop timing, autoscaling and version TTL (`--version-ttl`)."""
    runtime: Annotated[Literal["local", "ray"], Flag("--runtime")] = "local"
    """Where instances run: `local` processes or `ray` actors on a Ray cluster."""
    ray_address: Annotated[str | None, Flag("--ray-address", metavar="HOST:PORT")] = None
    """HOST:PORT of the Ray head to join (with --runtime ray); None starts a local head (or
    uses RAY_ADDRESS)."""
    ray_num_cpus: Annotated[float | None, Flag("--ray-cpus", metavar="N")] = None
    """CPUs each instance's actor reserves on Ray (default 1; > 0, checked with the runtime);
    Ray also sets the server's OMP_NUM_THREADS to it, so a CPU LLM wants several."""
    api_key: Annotated[str | None, NotAFlag("--api-key fills keys.api_keys", "--api-key")] = None
    """When set, the gateway (HTTP and gRPC) and the control-plane API require
    `Authorization: Bearer <key>`; liveness stays open. Added to `keys.api_keys`."""
    keys: Annotated[InstanceOf[KeyConfig], NotAFlag(KEY_FLAGS)] = Field(
        default_factory=KeyConfig)
    """Inference keys (the gateway) and admin keys (the control API, the gateway's /metrics),
    literal or in files re-read when changed; with no admin key, inference keys are both.
    Instances accept none of them: only the plane's internal credential."""
    limits: Annotated[GatewayLimits, NotAFlag("gateway.limits.add_flags: one flag per field "
                                              "of GatewayLimits")] = Field(
        default_factory=GatewayLimits)
    """What the gateway accepts from one request: body, headers, gRPC message, body time."""
    api_max_body_bytes: Annotated[int, Field(ge=1024, le=1024**3, strict=True),
                                  Flag("--api-max-body-bytes")] = DEFAULT_MAX_BODY_BYTES
    """Largest request body the control-plane API reads, declared or sent (413 past it)."""
    api_max_header_bytes: Annotated[int, Field(ge=1024, le=1024**2, strict=True),
                                    Flag("--api-max-header-bytes")] = DEFAULT_MAX_HEADER_BYTES
    """Largest total size of a request's headers the control-plane API takes (431 past it)."""
    package_roots: Annotated[tuple[Path, ...], Flag("--package-root", metavar="DIR")] = ()
    """Announce only packages under these directories (repeatable; default: anywhere)."""
    shutdown_timeout_s: Annotated[float, Field(ge=1, le=3600, strict=True),
                                  Flag("--shutdown-timeout", metavar="SECONDS")] = 60.0
    """SIGTERM ends `podium up` within this many seconds (1..3600): requests finish, instances
    drain and stop; at the deadline whatever is left of its process tree is killed."""
    regions: Annotated[tuple[InstanceOf[RegionSpec], ...], NotAFlag(
        "--region / --regions-file (control/cli.py, region_config)")] = ()
    """Declared regions in rollout order, each with its runtime and gateway ports (then
    `runtime`, `ray_address`, `http_port` and `grpc_port` are not used); none: one region."""

    @model_validator(mode="after")
    def _check(self) -> UpConfig:
        if self.regions:
            check_regions(list(self.regions), api_port=self.api_port)
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
                raise InvalidArgument(f"--package-root {str(root)!r}: package root is not a "
                                      "directory", param="package_roots")
        return self

    def key_config(self) -> KeyConfig:
        """The keys of the gateway and the control API (`api_key` among the inference keys)."""
        if self.api_key:
            return replace(self.keys, api_keys=(self.api_key, *self.keys.api_keys))
        return self.keys

    def access(self, internal_key: str | None = None) -> Access:
        """Per role, the keys the control API accepts: where it takes any, also the plane's
        `internal_key`, which its gateways show it (an API without keys stays open)."""
        keys = self.key_config()
        if keys.api_keys or keys.api_key_files or keys.has_admin_keys:
            keys = replace(keys, internal_key=internal_key)
        return keys.access()
