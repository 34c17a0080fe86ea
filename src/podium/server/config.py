"""Settings of one instance (`podium serve`), validated on construction."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from podium.frontends import kserve_limits as kserve
from podium.frontends.header_limit import DEFAULT_MAX_HEADER_BYTES
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
    max_header_bytes: int = Field(default=DEFAULT_MAX_HEADER_BYTES, ge=1024,
                                  description="Largest total of request header names and "
                                  "values (431 past it).")
    max_inflated_bytes: int = Field(default=kserve.DEFAULT_MAX_INFLATED_BYTES, ge=1024,
                                    description="Largest KServe body once gzip/deflate is "
                                    "inflated (413 past it).")
    max_json_depth: int = Field(default=kserve.DEFAULT_MAX_JSON_DEPTH, ge=2, le=500,
                                description="Deepest JSON nesting in a KServe body (400).")
    max_tensors: int = Field(default=kserve.DEFAULT_MAX_TENSORS, ge=1,
                             description="Most inputs, and most outputs, per KServe request.")
    max_elements: int = Field(default=kserve.DEFAULT_MAX_ELEMENTS, ge=1,
                              description="Most tensor elements per KServe request (413).")
    grpc_max_message_bytes: int = Field(default=kserve.DEFAULT_GRPC_MAX_MESSAGE_BYTES,
                                        ge=1024, description="Largest gRPC message received "
                                        "(RESOURCE_EXHAUSTED past it).")
    shutdown_timeout_s: float = Field(default=30.0, ge=0,
                                      description="How long SIGTERM may take in all (requests, "
                                      "then unloading); then the process tree is killed.")
    log_format: Literal["text", "json"] = Field(default="text",
                                                description="json: one JSON line per request.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def kserve_limits(self) -> kserve.KServeLimits:
        """The limits both KServe frontends enforce."""
        return kserve.KServeLimits(
            max_body_bytes=self.max_body_bytes, max_inflated_bytes=self.max_inflated_bytes,
            max_json_depth=self.max_json_depth, max_tensors=self.max_tensors,
            max_elements=self.max_elements, grpc_max_message_bytes=self.grpc_max_message_bytes)
