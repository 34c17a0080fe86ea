"""A repository load request (`POST /v2/repository/models/<m>/load`, gRPC
`RepositoryModelLoad`) and Triton's config override: `parameters: {"config": "<json>"}`
replaces a Triton model's config.pbtxt for that load, as Triton does, and its `file:<path>`
parameters the model's folder; a later load without them reads the repository again."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from podium.errors import InvalidArgument, PackageError
from podium.repository.policy import VersionPolicy
from podium.triton.config import check_supported, model_config_pb2
from podium.triton.package import TritonPackage
from podium.triton.scan import model_packages


@dataclass(frozen=True)
class LoadRequest:
    """What a load request asks beyond the model's name."""

    policy: VersionPolicy | None = None
    """Which versions to serve; None: the model's own (a Triton config's version_policy)."""
    config: dict[str, Any] | None = None
    """Triton's `config` parameter when it is a model config (more than version_policy)."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Triton's `file:<path>` parameters: the model folder's files for this load (with
    `config`), by path inside the folder."""


def override_packages(root: Path, name: str, config: dict[str, Any],
                      files: dict[str, bytes] | None = None) -> list[TritonPackage]:
    """The versions of the Triton model at `root` served under `config` (a model config in
    Triton's JSON, as `/v2/models/<m>/config` answers it), checked as a config.pbtxt is."""
    from google.protobuf import json_format

    where = "load parameter 'config'"
    try:
        message = json_format.ParseDict(config, model_config_pb2().ModelConfig())
    except json_format.ParseError as exc:
        raise InvalidArgument(f"{where} is not a Triton model config: {exc}",
                              param="config") from None
    if message.name and message.name != name:
        raise InvalidArgument(f"{where} has name={message.name!r}; it configures model "
                              f"{name!r} (leave name out or set it to {name!r})",
                              param="config.name")
    check_supported(message, where)  # the same allow-list as config.pbtxt, by field name
    if files:
        root = write_load_files(name, files)
    return model_packages(root, config=message)


def check_override_target(name: str, packaged: list[Any], config: dict[str, Any]) -> Path:
    """The Triton model folder a config override applies to; a Podium package refuses it."""
    triton = [p for p in packaged if isinstance(p, TritonPackage)]
    if not triton:
        fields = sorted(set(config) - {"version_policy", "name"})
        raise PackageError(f"load parameter 'config' sets {fields}; only version_policy can be "
                           f"changed at load for {name!r}, a Podium package (change podium.json "
                           "and announce a new version; a full config replaces only a Triton "
                           "model's config.pbtxt)", param="config")
    return triton[0].root


def write_load_files(name: str, files: dict[str, bytes]) -> Path:
    """A fresh model folder holding only `files` (Triton: they replace the model's folder for
    this load); returns it. A path leaving the folder is refused naming its parameter."""
    for relative in files:
        path = PurePosixPath(relative)
        if (not relative or path.is_absolute() or ".." in path.parts or "\\" in relative
                or relative.endswith("/")):
            raise InvalidArgument(f"load parameter 'file:{relative}': a file path inside the "
                                  "model folder, e.g. file:1/model.py", param=f"file:{relative}")
    root = Path(tempfile.mkdtemp(prefix="podium-load-")) / name
    root.mkdir()
    for relative, content in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return root
