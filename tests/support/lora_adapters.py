"""Small random-but-nonzero LoRA adapters in PEFT's format for the default model (no training,
no torch: numpy + safetensors), and adapter packages around them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_BASE = "smollm2-135m-instruct@1"
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 576, 1536, 9, 3, 64, 30
_WIDTHS = {  # module → (in, out) of SmolLM2-135M
    "q_proj": (HIDDEN, HEADS * HEAD_DIM), "k_proj": (HIDDEN, KV_HEADS * HEAD_DIM),
    "v_proj": (HIDDEN, KV_HEADS * HEAD_DIM), "o_proj": (HEADS * HEAD_DIM, HIDDEN),
    "gate_proj": (HIDDEN, INTERMEDIATE), "up_proj": (HIDDEN, INTERMEDIATE),
    "down_proj": (INTERMEDIATE, HIDDEN)}
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
           "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter_files(folder: Path, *, seed: int, rank: int = 8,
                        modules: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "down_proj"),
                        scale: float = 0.5, widths: dict[str, tuple[int, int]] | None = None,
                        layers: int = LAYERS, config: dict[str, Any] | None = None,
                        bf16: bool = False) -> Path:
    """PEFT's adapter_config.json + adapter_model.safetensors with random weights large
    enough to change greedy answers."""
    from safetensors.numpy import save_file

    widths = widths or _WIDTHS
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for module in modules:
            fan_in, fan_out = widths[module]
            prefix = (f"base_model.model.model.layers.{layer}."
                      f"{_PARENT.get(module, 'self_attn')}.{module}")
            tensors[f"{prefix}.lora_A.weight"] = (
                rng.standard_normal((rank, fan_in)) * scale / np.sqrt(fan_in)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (
                rng.standard_normal((fan_out, rank)) * scale / np.sqrt(rank)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    if bf16:  # the engine's own dtype here, so PEFT and vLLM add the very same deltas
        import torch
        from safetensors.torch import save_file as save_torch

        save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()},
                   str(folder / "adapter_model.safetensors"))
    else:
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    adapter_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
                      "lora_alpha": rank * 2, "lora_dropout": 0.0, "bias": "none",
                      "target_modules": list(modules), "base_model_name_or_path": None,
                      "fan_in_fan_out": False, "inference_mode": True,
                      "modules_to_save": None, "use_dora": False, "use_rslora": False,
                      **(config or {})}
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return folder


def write_adapter_package(folder: Path, name: str, *, seed: int, version: str = "1",
                          base: str = DEFAULT_BASE, rank: int = 8,
                          manifest: dict[str, Any] | None = None, **files: Any) -> Path:
    """An adapter package: podium.json + the random adapter's files."""
    write_adapter_files(folder, seed=seed, rank=rank, **files)
    data = {"name": name, "version": version, "backend": "lora", "base": base, "rank": rank,
            **(manifest or {})}
    (folder / "podium.json").write_text(json.dumps(data, indent=2))
    return folder
