"""Quantized checkpoints written from a cached bf16 folder, for precisions vLLM cannot make at load.

    $PODIUM_CACHE/objects/<sha256 of recipe + base key>/   config.json with a
        compressed-tensors quantization_config, model.safetensors with int8 Linear weights and
        their scales, the base's tokenizer files; podium-object.json names the base object

vLLM 0.32 serves int8 W8A8 only from a checkpoint in the compressed-tensors format (its online
methods quantize to fp8, or int8 for MoE experts only), and no pre-quantized checkpoint may be
downloaded here, so Podium writes one: every `nn.Linear` but the LM head (tied to the
embeddings in the default model) gets symmetric per-output-channel int8 weights; activations
are quantized per token at run time by the engine. The result is keyed by the base object and
the recipe, so it is built once per source and reused like any other cache object.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.package.objects import OBJECT_INFO, publish, sha256_file, staging_for
from podium.package.progress import Progress

log = logging.getLogger("podium.quantize")
RECIPE_VERSION = "1"
"""Bump when a recipe's output changes, so the cache rebuilds instead of reusing old objects."""
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class Recipe:
    """How one precision's checkpoint is written."""

    name: str
    weight_bits: int
    """Bits of the symmetric integer weights (the scale maps a row's max |w| to 2^(bits-1)-1)."""
    preset: str
    """compressed-tensors' preset scheme that describes the result to vLLM."""


RECIPES = {"w8a8-int8": Recipe("w8a8-int8", weight_bits=8, preset="W8A8")}


def derived_key(base_key: str, recipe: Recipe) -> str:
    """The cache key of `recipe` applied to the object `base_key`."""
    spec = f"podium-quantize/{RECIPE_VERSION}\0{recipe}\0{base_key}"
    return hashlib.sha256(spec.encode()).hexdigest()


def derive(root: Path, base_key: str, base: Path, recipe_name: str,
           progress: Progress | None = None) -> tuple[str, Path, bool]:
    """The quantized object for `base` under `root/objects`: (key, path, reused)."""
    recipe = RECIPES[recipe_name]
    key = derived_key(base_key, recipe)
    target = root / "objects" / key
    if (target / OBJECT_INFO).is_file():
        return key, target, True
    with staging_for(target) as staging:
        with (progress or Progress()).task(f"writing the {recipe.name} checkpoint", None):
            write_checkpoint(base, staging, recipe)
        files = {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}
        publish(staging, target, {"key": key, "derived_from": base_key, "recipe": recipe.name,
                                  "recipe_version": RECIPE_VERSION, "files": files})
    log.info("wrote the %s checkpoint of %s into %s", recipe.name, base_key[:12], target)
    return key, target, False


def write_checkpoint(source: Path, target: Path, recipe: Recipe) -> None:
    """Quantize the Linear weights of the HF folder `source` into `target`."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    if config.get("quantization_config"):
        raise ValueError(f"{source} is already quantized "
                         f"({config['quantization_config'].get('quant_method')})")
    tensors: dict[str, Any] = {}
    for file in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(file))
    linear = linear_weights(source, tensors)
    qmax = 2 ** (recipe.weight_bits - 1) - 1
    for name in linear:
        weight = tensors[name].to(torch.float32)
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / qmax
        tensors[name] = torch.round(weight / scale).clamp(-qmax, qmax).to(torch.int8)
        tensors[name.removesuffix("weight") + "weight_scale"] = scale
    save_file(tensors, target / WEIGHTS_FILE, metadata={"format": "pt"})
    config["quantization_config"] = quantization_config(recipe)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    for file in source.iterdir():  # tokenizer, chat template, generation config
        if (file.is_file() and file.suffix != ".safetensors"
                and file.name not in ("config.json", OBJECT_INFO, "model.safetensors.index.json")):
            _link_or_copy(file, target / file.name)


def linear_weights(source: Path, tensors: dict[str, Any]) -> list[str]:
    """Names of the stored weights that belong to `nn.Linear` layers, the LM head excepted:
    found by building the model on the meta device, so no architecture is hard-coded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    names = [f"{name}.weight" for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and module is not head]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ValueError(f"{source}: Linear weights not in the checkpoint: {missing[:3]}")
    return names


def quantization_config(recipe: Recipe) -> dict[str, Any]:
    """config.json's quantization_config, built with compressed-tensors' own schema."""
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        preset_name_to_scheme,
    )

    config = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(recipe.preset, ["Linear"])},
        format=CompressionFormat.int_quantized.value,
        quantization_status=QuantizationStatus.COMPRESSED, ignore=["lm_head"])
    return config.model_dump(mode="json")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # same filesystem: no bytes copied
    except OSError:
        shutil.copy2(source, target)
