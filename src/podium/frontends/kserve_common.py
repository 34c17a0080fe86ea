"""What the KServe HTTP and gRPC frontends answer alike: metadata, load parameters."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import podium
from podium.backends.validation import expected_shape
from podium.errors import InvalidArgument
from podium.frontends.safe_json import loads_value
from podium.repository import LoadRequest, ModelRepository, VersionPolicy

SERVER_NAME = "podium"
EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics", "generate", "parameters"]
"""Not `model_repository(unload_dependents)`: see :func:`check_unload_parameters`."""


def server_metadata() -> dict[str, Any]:
    """`GET /v2`: name, version and the protocol extensions served."""
    return {"name": SERVER_NAME, "version": podium.__version__, "extensions": EXTENSIONS}


def model_metadata(repository: ModelRepository, name: str, version: str | None
                   ) -> dict[str, Any]:
    """`GET /v2/models/{m}[/versions/{v}]`: versions, platform and I/O with batch dimension."""
    backend = repository.find(name, version).backend
    versions = repository.versions(name)
    batch = backend.max_batch_size
    return {
        "name": backend.name,
        "versions": versions or [backend.version],
        "platform": backend.platform,
        "inputs": [{"name": s.name, "datatype": s.datatype, "shape": expected_shape(s, batch)}
                   for s in backend.inputs()],
        "outputs": [{"name": s.name, "datatype": s.datatype, "shape": expected_shape(s, batch)}
                    for s in backend.outputs()],
    }


def load_request(parameters: dict[str, Any] | None) -> LoadRequest:
    """A repository load request's parameters: the version policy, Triton's config, files.

    `parameters.version_policy`, or Triton's `parameters.config` (a model config as a JSON
    string). A config of only `version_policy` (and `name`) changes the policy of any model; a
    fuller one replaces a Triton model's config.pbtxt for this load, as in Triton (a Podium
    package refuses it when the model is loaded). `file:<path>` parameters (base64 over HTTP,
    bytes over gRPC) are the model folder's files for this load; they need a config.
    """
    parameters = dict(parameters or {})
    policy = parameters.pop("version_policy", None)
    config = parameters.pop("config", None)
    files = {key: _file_content(key, parameters.pop(key))
             for key in sorted(k for k in parameters if k.startswith("file:"))}
    override = None
    if config is not None:
        config_data = (loads_value(config, field="load parameter 'config'")
                       if isinstance(config, str) else config)
        if not isinstance(config_data, dict):
            raise InvalidArgument("load parameter 'config' must be a JSON object",
                                  param="config")
        if files or set(config_data) - {"version_policy", "name"}:
            override = config_data
        else:
            policy = config_data.get("version_policy", policy)
    elif files:
        first = next(iter(files))
        raise InvalidArgument(f"load parameter {first!r}: files replace the model's folder, "
                              "so the load must carry its config too (parameter 'config', "
                              "as Triton requires)", param=first)
    if parameters:
        raise InvalidArgument(f"load parameters {sorted(parameters)} are not supported; use "
                              "version_policy, config or file:<path>",
                              param=sorted(parameters)[0])
    return LoadRequest(None if policy is None else VersionPolicy.parse(policy), override,
                       {key.removeprefix("file:"): content for key, content in files.items()})


def _file_content(key: str, value: Any) -> bytes:
    """A `file:` parameter's bytes: base64 text over HTTP, raw bytes over gRPC."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise InvalidArgument(f"load parameter {key!r} must be the file's content, base64-encoded "
                          "(tritonclient's load_model(files=...) does it)", param=key)


def check_unload_parameters(parameters: dict[str, Any]) -> None:
    """Triton's one unload parameter is `unload_dependents` (tritonclient sends false by
    default). A Podium package declares no composing models (an ensemble's code names the models
    it calls), so there is nothing to unload beyond the model named: true is refused, not
    ignored."""
    unknown = sorted(set(parameters) - {"unload_dependents"})
    if unknown:
        raise InvalidArgument(f"unload parameters {unknown} are not supported",
                              param=unknown[0])
    value = parameters.get("unload_dependents", False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"unload parameter unload_dependents={value!r} must be true or "
                              "false", param="unload_dependents")
    if value:
        raise InvalidArgument("unload_dependents=true: Podium's packages declare no composing "
                              "models (an ensemble's code names the models it calls), so there "
                              "are no dependents to unload; unload each model by name",
                              param="unload_dependents")
