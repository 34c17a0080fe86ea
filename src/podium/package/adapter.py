"""LoRA adapter packages: what one is (`adapter_of`), and the checks that keep an adapter a
base cannot serve from ever reaching its engine.

An adapter package is a manifest with `"backend": "lora"` and `"base": "name@version"` plus
PEFT's two files, `adapter_config.json` and `adapter_model.safetensors`. It is checked on its
own when packaged (`check_files`: the files, their sizes, PEFT's config, the tensors' names and
shapes against the rank) and against its base when announced and when an instance serves it
(`check_fits_base`: the base enables LoRA, the rank is within its `max_lora_rank`, every
targeted module exists in the base with the widths the adapter's tensors have; another
architecture or vocabulary shows up as a module it lacks or a width that differs). Nothing here
imports torch: safetensors headers are read as JSON.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.errors import PackageError
from podium.package.lora_manifest import LoraSettings
from podium.package.paths import DIRECTORY, FILE, named_path, read_small_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1024 * 1024
"""adapter_config.json is read only up to 1 MiB: it holds settings, never data."""
MAX_WEIGHTS_BYTES = 2 * 1024 ** 3
"""An adapter's weights above 2 GiB are refused: an adapter is a small delta, not a model."""
MAX_HEADER_BYTES = 64 * 1024 * 1024
_TENSOR = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<kind>lora_A|lora_B|"
                     r"lora_embedding_A|lora_embedding_B)(?:\.weight)?$")


@dataclass(frozen=True)
class AdapterInfo:
    """An adapter package as the control plane and the instance see it."""

    name: str
    version: str
    base_name: str
    base_version: str
    rank: int

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def base_key(self) -> str:
        return f"{self.base_name}@{self.base_version}"


def adapter_of(manifest: Any) -> AdapterInfo | None:
    """The adapter a manifest (the pydantic model, or its JSON as stored) describes; None for
    any other package."""
    data = manifest if isinstance(manifest, Mapping) else manifest.model_dump(mode="json")
    if data.get("backend") != "lora":
        return None
    base_name, _, base_version = str(data["base"]).partition("@")
    return AdapterInfo(name=data["name"], version=str(data.get("version", "1")),
                       base_name=base_name, base_version=base_version, rank=int(data["rank"]))


@dataclass(frozen=True)
class AdapterFiles:
    """An adapter's PEFT files, read and checked on their own."""

    folder: Path
    config: dict[str, Any]
    tensors: dict[str, list[int]]
    """Tensor name → shape, from the safetensors header."""

    @property
    def target_modules(self) -> list[str]:
        modules = self.config.get("target_modules") or []
        return [modules] if isinstance(modules, str) else list(modules)


def check_files(root: Path, manifest: Any) -> AdapterFiles:
    """The adapter's files inside the package `root`, checked against its manifest: present,
    regular, within the size caps, PEFT's LoRA config with rank = the manifest's `rank`, and
    tensors whose shapes carry that rank."""
    folder = named_path(root, manifest.path, "path", (DIRECTORY,))
    config_path = named_path(root, _join(manifest.path, ADAPTER_CONFIG), "path", (FILE,),
                             must_exist=False)
    weights = named_path(root, _join(manifest.path, ADAPTER_WEIGHTS), "path", (FILE,),
                         must_exist=False)
    for required in (config_path, weights):
        if not required.is_file():
            raise PackageError(f"path={manifest.path!r}: {required.name} is missing; an "
                               f"adapter package holds PEFT's {ADAPTER_CONFIG} and "
                               f"{ADAPTER_WEIGHTS} (save_pretrained writes both)",
                               param="path")
    size = weights.stat().st_size
    if size > MAX_WEIGHTS_BYTES:
        raise PackageError(f"{ADAPTER_WEIGHTS} is {size} bytes, over the {MAX_WEIGHTS_BYTES} "
                           "byte limit of an adapter; lower its rank or its target modules",
                           param="path")
    config = _read_config(config_path, root)
    tensors = read_safetensors_header(weights)
    files = AdapterFiles(folder, config, tensors)
    _check_config(files, manifest.rank)
    return files


def check_fits_base(files: AdapterFiles, info: AdapterInfo, lora: LoraSettings | None,
                    base_dir: Path) -> None:
    """Refuse an adapter its base cannot serve, naming the field: `base` (LoRA off there),
    `rank` (above the base's `max_lora_rank`), `target_modules` (modules the base lacks, or
    widths another architecture or vocabulary has)."""
    if lora is None:
        raise PackageError(f"base={info.base_key!r} does not enable LoRA adapters; add "
                           "\"lora\": {} to its podium.json (a new version of it)",
                           param="base")
    if info.rank > lora.max_lora_rank:
        raise PackageError(f"rank={info.rank} is above the max_lora_rank={lora.max_lora_rank} "
                           f"of base {info.base_key}; train the adapter with r <= "
                           f"{lora.max_lora_rank}, or raise lora.max_lora_rank in the base",
                           param="rank")
    base = base_shapes(base_dir)
    leaves = {name.rsplit(".", 2)[-2] for name in base if name.endswith(".weight")
              and name.count(".") >= 1}
    missing = [m for m in files.target_modules if m not in leaves]
    if missing:
        raise PackageError(f"target_modules {missing} are not modules of base {info.base_key} "
                           f"(it has {', '.join(sorted(leaves))}); the adapter was trained "
                           "for another architecture", param="target_modules")
    for name, shape in files.tensors.items():
        _check_tensor(name, shape, base, info)


def _check_tensor(name: str, shape: list[int], base: dict[str, list[int]],
                  info: AdapterInfo) -> None:
    match = _TENSOR.match(name)
    assert match is not None  # _check_config refused the others
    module, kind = match["module"], match["kind"]
    target = base.get(f"{module}.weight")
    if target is None:
        raise PackageError(f"adapter tensor {name} targets {module}, which base "
                           f"{info.base_key} does not have: the adapter was trained for another "
                           "architecture", param="target_modules")
    if kind.startswith("lora_embedding"):  # embedding weight: [vocab, hidden]
        want, have = ((target[0], shape[1]) if kind.endswith("A") else (target[1], shape[0]))
        what = "vocabulary" if kind.endswith("A") else "width"
    else:  # linear weight: [out, in]; lora_A: [r, in], lora_B: [out, r]
        want, have = ((target[1], shape[1]) if kind == "lora_A" else (target[0], shape[0]))
        what = "input width" if kind == "lora_A" else "output width"
    if want != have:
        raise PackageError(f"adapter tensor {name} has {what} {have} but {module} of base "
                           f"{info.base_key} has {want}: the adapter was trained for another "
                           "architecture or vocabulary", param="target_modules")


def base_shapes(base_dir: Path) -> dict[str, list[int]]:
    """Every weight's shape of a materialized base (all safetensors shards)."""
    shapes: dict[str, list[int]] = {}
    for shard in sorted(base_dir.glob("*.safetensors")):
        shapes.update(read_safetensors_header(shard))
    if not shapes:
        raise PackageError(f"{base_dir}: the base holds no safetensors weights to check the "
                           "adapter against", param="base")
    return shapes


def read_safetensors_header(path: Path) -> dict[str, list[int]]:
    """Tensor name → shape from a safetensors file's JSON header (no tensor is read)."""
    try:
        with path.open("rb") as file:
            head = file.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
            if not 0 < length <= MAX_HEADER_BYTES:
                raise ValueError("no safetensors header")
            header = json.loads(file.read(length))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PackageError(f"{path.name} is not a safetensors file ({exc}); save the adapter "
                           "with PEFT's save_pretrained (safe_serialization)",
                           param="path") from None
    if not isinstance(header, dict):
        raise PackageError(f"{path.name}: the safetensors header is not an object",
                           param="path")
    return {name: list(entry.get("shape", [])) for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict)}


def _read_config(path: Path, root: Path) -> dict[str, Any]:
    raw = read_small_file(path, root, MAX_CONFIG_BYTES, ADAPTER_CONFIG)
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise PackageError(f"{ADAPTER_CONFIG} is not valid JSON ({exc})", param="path") from None
    if not isinstance(config, dict):
        raise PackageError(f"{ADAPTER_CONFIG} must be a JSON object", param="path")
    return config


def _check_config(files: AdapterFiles, rank: int) -> None:
    config = files.config
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise PackageError(f"{ADAPTER_CONFIG}: peft_type={config.get('peft_type')!r}; only "
                           "LoRA adapters (peft_type \"LORA\") are served", param="path")
    if config.get("r") != rank:
        raise PackageError(f"rank={rank} but {ADAPTER_CONFIG} has r={config.get('r')!r}; set "
                           "the manifest's rank to the adapter's r", param="rank")
    if config.get("use_dora"):
        raise PackageError(f"{ADAPTER_CONFIG}: use_dora is true; vLLM serves plain LoRA "
                           "only, train without DoRA", param="path")
    if config.get("modules_to_save"):
        raise PackageError(f"{ADAPTER_CONFIG}: modules_to_save={config['modules_to_save']!r} "
                           "replaces whole modules, which vLLM does not serve; train without "
                           "it", param="target_modules")
    if not files.tensors:
        raise PackageError(f"{ADAPTER_WEIGHTS} holds no tensors", param="path")
    for name, shape in files.tensors.items():
        match = _TENSOR.match(name)
        if match is None or len(shape) != 2:
            raise PackageError(f"{ADAPTER_WEIGHTS}: {name} {shape} is not a LoRA tensor "
                               "(…lora_A.weight / …lora_B.weight, two dimensions)",
                               param="path")
        rank_axis = 0 if match["kind"] in ("lora_A", "lora_embedding_A") else 1
        if shape[rank_axis] != rank:
            raise PackageError(f"{ADAPTER_WEIGHTS}: {name} has rank {shape[rank_axis]}, not "
                               f"the r={rank} of {ADAPTER_CONFIG}", param="rank")


def _join(folder: str, name: str) -> str:
    return name if folder in ("", ".") else f"{folder.rstrip('/')}/{name}"
