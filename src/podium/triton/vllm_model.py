"""Triton's vLLM backend: `<version>/model.json` holds vLLM's engine arguments; Podium serves it
with its own vLLM backend (which speaks Triton's vLLM tensors: text_input, stream,
sampling_parameters, ... → text_output).

`model` must name weights on this machine: an absolute path, or a path inside the model
folder. A Hugging Face id is refused (instances serve from local weights only); so are engine
arguments Podium sets itself (`tokenizer` becomes the manifest's tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from podium.errors import PackageError
from podium.package.manifest import VllmManifest

TENSORS = {"text_input", "stream", "sampling_parameters", "exclude_input_in_output",
           "return_finish_reason", "return_cumulative_logprob", "return_logprobs",
           "return_num_input_tokens", "return_num_output_tokens", "text_output",
           "finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens",
           "num_output_tokens"}
"""Triton's vLLM backend tensors; a config may declare these and no others."""
_DROPPED = {"disable_log_requests", "disable_log_stats"}
"""Logging switches of vLLM's server, which Podium's own logging replaces."""


def vllm_manifest(root: Path, version: str, config: Any) -> VllmManifest:
    where = root / version / "model.json"
    for tensor in [*config.input, *config.output]:
        if tensor.name not in TENSORS:
            raise PackageError(f"{root / 'config.pbtxt'}: tensor {tensor.name!r} is not one of "
                               "Triton's vLLM backend tensors", param="input")
    try:
        args = json.loads(where.read_text())
    except (OSError, ValueError) as exc:
        raise PackageError(f"{where}: cannot be read as JSON ({exc})", param="model.json") from None
    if not isinstance(args, dict) or not isinstance(args.get("model"), str):
        raise PackageError(f"{where}: needs \"model\": the weights' path", param="model.json")
    args = {k: v for k, v in args.items() if k not in _DROPPED}
    weights = _weights(root, version, args.pop("model"), where, "model")
    tokenizer = args.pop("tokenizer", None)
    try:
        return VllmManifest(
            backend="vllm", name=root.name, version=version,
            description=f"Triton vLLM model {root.name}", weights=weights,
            tokenizer=_weights(root, version, tokenizer, where, "tokenizer")
            if isinstance(tokenizer, str) else None,
            engine_args=args)
    except ValueError as exc:
        raise PackageError(f"{where}: {exc}", param="model.json") from None


def _weights(root: Path, version: str, value: str, where: Path, key: str) -> dict[str, str]:
    path = Path(value)
    if path.is_absolute():
        return {"source": "path", "path": value}
    for base, inside in ((root / version, f"{version}/{value}"), (root, value)):
        if (base / value).exists():
            return {"source": "package", "path": inside}
    raise PackageError(f"{where}: {key}={value!r} is not a local path (an absolute path, or "
                       "one inside the model folder); Podium serves weights on this machine "
                       "only, not Hugging Face ids", param=f"model.json:{key}")
