"""Settings of one instance (`podium serve`), validated on construction."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, FilePath, PrivateAttr, SecretStr, model_validator

from podium.auth_keys import Access, KeyConfig
from podium.backends.limits import DEFAULT_ADMISSION_TARGET_WAIT_S, InstanceLimits
from podium.config_flags import Flag, NotAFlag, ProcessConfig
from podium.edge.body import DEFAULT_MAX_BODY_BYTES
from podium.errors import InvalidArgument
from podium.frontends import kserve_limits as kserve
from podium.frontends.json_body import (
    DEFAULT_MAX_INFLATED_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    BodyLimits,
)
from podium.gateway.limits import DEFAULT_MAX_HEADER_BYTES
from podium.model_control import Mode, ModelControl

Key = Annotated[str, Field(min_length=1)]
_KEY_FLAGS = "--api-key, --api-key-file, --admin-key, --admin-key-file: cli.KeyFlags"


class ServerConfig(ProcessConfig):
    """What `podium serve` was asked to do: one field per flag (`add_flags`), each with its
    bounds; a bad value is an `InvalidArgument` naming the flag and the bound."""

    model_config = ConfigDict(extra="forbid")

    packages: Annotated[list[Path], Flag(
        "packages", help="package directories or .tar.gz files (default: "
        "smollm2-135m-instruct)")] = Field(
        default_factory=list, description="Package directories or .tar.gz files to serve.")
    repository: Annotated[Path | None, Flag("--repository")] = Field(
        default=None, description="Serve every package found in this directory.")
    model_control_mode: Annotated[Mode, Flag("--model-control-mode")] = Field(
        default="podium", description="Triton's model control: podium (load all at start, "
        "load/unload API open), none (load all, API refused), explicit (load only "
        "--load-model names), poll (load all, then follow the --repository folder).")
    load_models: Annotated[list[str], Flag("--load-model", metavar="NAME")] = Field(
        default_factory=list, description="With --model-control-mode=explicit: a model to "
        "load at start (repeatable; '*' loads all).")
    repository_poll_secs: Annotated[float | None, Flag("--repository-poll-secs")] = Field(
        default=None, gt=0, le=86_400, description="With --model-control-mode=poll: seconds "
        "between polls of the repository folder (default 15).")
    metrics_port: Annotated[int | None, Flag("--metrics-port")] = Field(
        default=None, ge=0, le=65535, strict=True,
        description="Also serve /metrics, with Triton's nv_inference_* metrics, on this port "
        "(Triton's 8002); default: only on --http-port.")
    host: Annotated[str, Flag("--host")] = Field(
        default="0.0.0.0", description="Address both ports bind to.")
    http_port: Annotated[int, Flag("--http-port")] = Field(
        default=8000, ge=0, le=65535, strict=True,
        description="OpenAI /v1, KServe /v2, /metrics and health.")
    grpc_port: Annotated[int, Flag("--grpc-port")] = Field(
        default=8001, ge=-1, le=65535, strict=True,
        description="KServe v2 gRPC; -1 disables it.")
    api_key: Annotated[str | None, NotAFlag("--api-key fills api_keys")] = Field(
        default=None, description="Bearer key required on every route but liveness (one of "
        "api_keys); None leaves the instance open.")
    api_keys: Annotated[list[Key], NotAFlag(_KEY_FLAGS, "--api-key")] = Field(
        default_factory=list, description="More inference keys; also the admin keys while no "
        "admin key is configured.")
    api_key_files: Annotated[list[FilePath], NotAFlag(_KEY_FLAGS, "--api-key-file")] = Field(
        default_factory=list, description="Files of inference keys, one per line, re-read "
        "when changed.")
    admin_keys: Annotated[list[Key], NotAFlag(_KEY_FLAGS, "--admin-key")] = Field(
        default_factory=list, description="Keys of the admin routes (/v2/repository, "
        "/metrics); then inference keys no longer open them.")
    admin_key_files: Annotated[list[FilePath], NotAFlag(_KEY_FLAGS, "--admin-key-file")] = Field(
        default_factory=list, description="Files of admin keys, one per line, re-read when "
        "changed.")
    internal_key: Annotated[SecretStr | None, NotAFlag("env PODIUM_INTERNAL_KEY")] = Field(
        default=None, description="The control plane's credential (from PODIUM_INTERNAL_KEY): "
        "accepted for every role; never shown.")
    metrics_open: Annotated[bool, Flag("--metrics-open")] = Field(
        default=False, strict=True,
        description="Serve /metrics without the API key (scrapers).")
    max_body_bytes: Annotated[int, Flag("--max-body-bytes")] = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1024, strict=True,
        description="Largest request body accepted (413 past it).")
    max_header_bytes: Annotated[int, Flag("--max-header-bytes")] = Field(
        default=DEFAULT_MAX_HEADER_BYTES, ge=1024, strict=True,
        description="Largest HTTP request head, request line and headers (431 past it).")
    max_inflated_bytes: Annotated[int, Flag("--max-inflated-bytes")] = Field(
        default=DEFAULT_MAX_INFLATED_BYTES, ge=1024, strict=True,
        description="Largest size a gzip/deflate OpenAI or KServe body may inflate to (413 "
        "past it).")
    max_json_depth: Annotated[int, Flag("--max-json-depth")] = Field(
        default=DEFAULT_MAX_JSON_DEPTH, ge=2, le=500, strict=True,
        description="Deepest nesting of arrays and objects in an OpenAI or KServe body (400 "
        "past it).")
    max_tensors: Annotated[int, Flag("--max-tensors")] = Field(
        default=kserve.DEFAULT_MAX_TENSORS, ge=1, strict=True,
        description="Most inputs, and most outputs, per KServe request.")
    max_elements: Annotated[int, Flag("--max-elements")] = Field(
        default=kserve.DEFAULT_MAX_ELEMENTS, ge=1, strict=True,
        description="Most tensor elements per KServe request (413).")
    grpc_max_message_bytes: Annotated[int, Flag("--grpc-max-message-bytes")] = Field(
        default=kserve.DEFAULT_GRPC_MAX_MESSAGE_BYTES, ge=1024, strict=True,
        description="Largest gRPC message received (RESOURCE_EXHAUSTED past it).")
    max_n: Annotated[int, Flag("--max-n")] = Field(
        default=InstanceLimits.max_n, ge=1, le=16384, strict=True,
        description="Completions per LLM request (n, OpenAI and KServe) unless a package sets "
        "its own max_n.")
    max_stop_strings: Annotated[int, Flag("--max-stop-strings")] = Field(
        default=InstanceLimits.max_stop_strings, ge=1, le=4096, strict=True,
        description="Entries of stop, stop_token_ids, bad_words.")
    max_stop_chars: Annotated[int, Flag("--max-stop-chars")] = Field(
        default=InstanceLimits.max_stop_chars, ge=1, le=1 << 20, strict=True,
        description="Characters of one stop string or bad word.")
    max_messages: Annotated[int, Flag("--max-messages")] = Field(
        default=InstanceLimits.max_messages, ge=1, le=1 << 20, strict=True,
        description="Entries of an OpenAI request's messages.")
    max_batch_conversations: Annotated[int, Flag("--max-batch-conversations")] = Field(
        default=InstanceLimits.max_batch_conversations, ge=1, le=4096, strict=True,
        description="Conversations of one /v1/chat/completions/batch request (each one "
        "engine request).")
    max_queue: Annotated[int | None, Flag("--max-queue")] = Field(
        default=None, ge=1, le=1_000_000, strict=True,
        description="Requests one model's dynamic batcher lets wait (429 past it); overrides "
        "every package's; default: the package's dynamic_batching.max_queue, else 1024.")
    queue_timeout_ms: Annotated[int | None, Flag("--queue-timeout-ms")] = Field(
        default=None, ge=1, le=3_600_000, strict=True,
        description="Longest a request waits for its batch before a 429; overrides every "
        "package's; default: the package's, else 30000.")
    max_num_queued_reqs: Annotated[int | None, Flag("--max-num-queued-reqs")] = Field(
        default=None, ge=1, le=1_000_000, strict=True,
        description="Requests one vLLM engine holds, waiting and running, before a 429; "
        "overrides every package's; default: the package's, else what the engine was "
        "measured to finish in --admission-target-wait-s.")
    max_num_queued_tokens: Annotated[int | None, Flag("--max-num-queued-tokens")] = Field(
        default=None, ge=1, le=1 << 40, strict=True,
        description="Prompt tokens in prefill one vLLM engine holds before a 429; overrides "
        "every package's; default: the package's, else what the engine was measured to "
        "prefill in --admission-target-wait-s.")
    admission_target_wait_s: Annotated[float, Flag("--admission-target-wait-s",
                                                    metavar="SECONDS")] = Field(
        default=DEFAULT_ADMISSION_TARGET_WAIT_S, ge=1, le=3600, strict=True,
        description="The wait an LLM engine's admission bounds are sized to: unless set, "
        "max_num_queued_* are the work the engine, measured after its warm-up, finishes in "
        "this time.")
    classic_target_wait_s: Annotated[float | None, Flag("--classic-target-wait-s",
                                                        metavar="SECONDS")] = Field(
        default=None, gt=0, le=60, strict=True,
        description="The wait a classic model's in-flight bound is sized to: the bound the "
        "gateway admits to is the requests the instance was measured to finish in this time "
        "(completions per busy second x the wait x the tail factor, at least 16, or 4 while "
        "the backend is measured saturated, at most the queue plus one batch); overrides "
        "every package's admission_target_wait_s; default: the package's, else 0.02.")
    shutdown_timeout_s: Annotated[float, Flag("--shutdown-timeout", metavar="SECONDS")] = Field(
        default=30.0, ge=0, strict=True,
        description="Seconds SIGTERM may take in all: in-flight requests, then unloading; past "
        "it the process tree is killed (exit 124).")
    log_format: Annotated[Literal["text", "json"], Flag("--log-format")] = Field(
        default="text", description="text, or json: one JSON line per request.")
    log_level: Annotated[Literal["debug", "info", "warning", "error"], Flag("--log-level")] = \
        Field(default="info", description="Least severe log record shown.")

    _access: Access | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_model_control(self) -> ServerConfig:
        self.model_control()  # --load-model without explicit: refused naming the flag
        if self.model_control_mode == "poll" and self.repository is None:
            raise InvalidArgument("--model-control-mode=poll follows a repository folder: give "
                                  "--repository DIR", param="--model-control-mode")
        return self

    def model_control(self) -> ModelControl:
        """What loads at start and whether the repository API may load and unload."""
        return ModelControl(self.model_control_mode, tuple(self.load_models),
                            self.repository_poll_secs)

    def keys(self) -> KeyConfig:
        """The keys this instance was started with."""
        return KeyConfig(
            api_keys=tuple([self.api_key] if self.api_key else []) + tuple(self.api_keys),
            api_key_files=tuple(self.api_key_files), admin_keys=tuple(self.admin_keys),
            admin_key_files=tuple(self.admin_key_files),
            internal_key=self.internal_key.get_secret_value() if self.internal_key else None)

    def access(self) -> Access:
        """Per role, the keys accepted (built once: key files keep their last read)."""
        if self._access is None:
            self._access = self.keys().access()
        return self._access

    @property
    def kserve_limits(self) -> kserve.KServeLimits:
        """The limits both KServe frontends enforce."""
        return kserve.KServeLimits(
            max_body_bytes=self.max_body_bytes, max_inflated_bytes=self.max_inflated_bytes,
            max_json_depth=self.max_json_depth, max_tensors=self.max_tensors,
            max_elements=self.max_elements, grpc_max_message_bytes=self.grpc_max_message_bytes)

    def instance_limits(self) -> InstanceLimits:
        """The admission settings and request caps every backend applies (the one caps type:
        KServe and OpenAI requests alike)."""
        return InstanceLimits(
            max_queue=self.max_queue, queue_timeout_ms=self.queue_timeout_ms,
            max_num_queued_reqs=self.max_num_queued_reqs,
            max_num_queued_tokens=self.max_num_queued_tokens,
            admission_target_wait_s=self.admission_target_wait_s,
            classic_target_wait_s=self.classic_target_wait_s, max_n=self.max_n,
            max_stop_strings=self.max_stop_strings, max_stop_chars=self.max_stop_chars,
            max_messages=self.max_messages,
            max_batch_conversations=self.max_batch_conversations)

    def body_limits(self) -> BodyLimits:
        """The bounds on an OpenAI request's JSON body."""
        return BodyLimits(max_body_bytes=self.max_body_bytes,
                          max_inflated_bytes=self.max_inflated_bytes,
                          max_json_depth=self.max_json_depth)
