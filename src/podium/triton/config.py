"""`config.pbtxt`: read with protobuf's text format into the `ModelConfig` message that
tritonclient ships, then checked against what Podium honours.

The check is an allow-list: every field set in the file (found by walking `ListFields()`) must
be one Podium implements, or the model is refused at load with the field's dotted name. A field
Podium does not know can therefore never be silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podium.errors import PackageError

CONFIG_NAME = "config.pbtxt"
MAX_CONFIG_BYTES = 1024 * 1024

MAP = "map"
"""A map field (`parameters`, `input_map`): accepted whole, its entries are the model's."""
_ALLOWED: dict[str, dict[str, Any]] = {
    "": {"name": None, "platform": None, "backend": None, "version_policy": "version_policy",
         "max_batch_size": None, "input": "io", "output": "io",
         "dynamic_batching": "dynamic_batching", "instance_group": "instance_group",
         "parameters": MAP, "default_model_filename": None,
         "model_transaction_policy": "model_transaction_policy",
         "ensemble_scheduling": "ensemble_scheduling", "sequence_batching": "sequence_batching"},
    "version_policy": {"latest": "latest", "all": "all", "specific": "specific"},
    "latest": {"num_versions": None},
    "all": {},
    "specific": {"versions": None},
    "io": {"name": None, "data_type": None, "dims": None, "reshape": "reshape",
           "optional": None},
    "reshape": {"shape": None},
    "dynamic_batching": {"preferred_batch_size": None, "max_queue_delay_microseconds": None,
                         "default_queue_policy": "queue_policy"},
    "queue_policy": {"max_queue_size": None},
    "instance_group": {"name": None, "kind": None, "count": None},
    "model_transaction_policy": {"decoupled": None},
    "ensemble_scheduling": {"step": "step"},
    "sequence_batching": {"direct": "direct", "oldest": "oldest", "control_input": "control_input",
                          "max_sequence_idle_microseconds": None},
    "direct": {},
    "oldest": {"max_candidate_sequences": None},
    "control_input": {"name": None, "control": "control"},
    "control": {"kind": None, "int32_false_true": None, "fp32_false_true": None,
                "bool_false_true": None, "data_type": None},
    "step": {"model_name": None, "model_version": None, "input_map": MAP, "output_map": MAP},
}


def model_config_pb2() -> Any:
    from tritonclient.grpc import model_config_pb2 as pb2  # protobuf: only when Triton is read

    return pb2


def read_config(path: Path) -> Any:
    """Parse one `config.pbtxt` into a `ModelConfig`; a malformed file is a PackageError
    carrying protobuf's line:column message."""
    from google.protobuf import text_format

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PackageError(f"{path}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise PackageError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    message = model_config_pb2().ModelConfig()
    try:
        text_format.Parse(raw.decode("utf-8"), message)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise PackageError(f"{path}: malformed config.pbtxt: {exc}", param="config.pbtxt") from None
    return message


def check_supported(message: Any, where: str) -> None:
    """Refuse the first set field Podium does not honour, naming it (e.g. `optimization`,
    `dynamic_batching.priority_levels`, `instance_group.kind=KIND_GPU`)."""
    _walk(message, "", "", where)
    pb2 = model_config_pb2()
    kinds = {pb2.ModelInstanceGroup.KIND_AUTO, pb2.ModelInstanceGroup.KIND_CPU}
    if message.backend == "vllm":  # the engine places itself: Triton's vLLM configs say MODEL
        kinds.add(pb2.ModelInstanceGroup.KIND_MODEL)
    for group in message.instance_group:
        if group.kind not in kinds:
            kind = pb2.ModelInstanceGroup.Kind.Name(group.kind)
            raise PackageError(f"{where}: instance_group.kind={kind} is not supported: Podium "
                               "runs these models on the CPU (use KIND_CPU)",
                               param="instance_group.kind")


def _walk(message: Any, rule: str, prefix: str, where: str) -> None:
    allowed = _ALLOWED[rule]
    for field, value in message.ListFields():
        dotted = f"{prefix}{field.name}"
        if field.name not in allowed:
            raise PackageError(f"{where}: field {dotted!r} is not supported by Podium; remove it "
                               "(see docs/triton.md for the fields Podium honours)", param=dotted)
        child = allowed[field.name]
        if child is None or child == MAP:
            continue
        items = value if field.label == field.LABEL_REPEATED else [value]
        for item in items:
            _walk(item, child, f"{dotted}.", where)


def parameters_of(message: Any) -> dict[str, str]:
    """`parameters { key: "k" value { string_value: "v" } }` as a plain dict."""
    return {key: value.string_value for key, value in message.parameters.items()}


def as_json(message: Any) -> dict[str, Any]:
    """The config as Triton serves it (`/v2/models/{m}/config`): proto field names."""
    from google.protobuf import json_format

    return json_format.MessageToDict(message, preserving_proto_field_name=True)
