"""Settings of one instance (`podium serve`), validated on construction."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from podium.frontends.http_body import DEFAULT_MAX_BODY_BYTES


class ServerConfig(BaseModel):
    """What `podium serve` was asked to do."""

    model_config = ConfigDict(extra="forbid")

    packages: list[Path] = Field(default_factory=list,
                                 description="Package directories or .tar.gz files to serve.")
    repository: Path | None = Field(default=None,
                                    description="Serve every package found in this directory.")
    host: str = Field(default="0.0.0.0", description="Address both ports bind to.")
    http_port: int = Field(default=8000, ge=0, le=65535,
                           description="OpenAI /v1, KServe /v2, /metrics and health.")
    grpc_port: int = Field(default=8001, ge=-1, le=65535,
                           description="KServe v2 gRPC; -1 disables it.")
    api_key: str | None = Field(default=None, description="Bearer key required on every route "
                                "but liveness; None leaves the instance open.")
    metrics_open: bool = Field(default=False,
                               description="Serve /metrics without the API key (scrapers).")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024,
                                description="Largest request body accepted (413 past it).")
    shutdown_timeout_s: float = Field(default=30.0, ge=0,
                                      description="How long SIGTERM may take in all (requests, "
                                      "then unloading); then the process tree is killed.")
    log_format: Literal["text", "json"] = Field(default="text",
                                                description="json: one JSON line per request.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
