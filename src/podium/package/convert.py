"""Recipes that turn a source format into a folder vLLM loads (bf16 safetensors + tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from podium.package.progress import Progress

RECIPE_VERSION = "1"
"""Bump when a recipe's output changes, so the cache rebuilds instead of reusing old objects."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "added_tokens.json")


def convert_gguf(gguf: Path, target: Path, progress: Progress) -> None:
    """GGUF (e.g. Q4_1) → bf16 safetensors: dequantize through transformers, then copy the
    state dict into a fresh model so no GGUF quantization config reaches vLLM."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with progress.task(f"converting {gguf.name} to bf16 safetensors", None):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      dtype=torch.float32)
        config = AutoConfig.for_model(**_plain_config(source.config))
        config.dtype = torch.bfloat16
        fresh = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        state = {k: v.to(torch.bfloat16) for k, v in source.state_dict().items()}
        result = fresh.load_state_dict(state, strict=False)
        if result.missing_keys:
            raise RuntimeError(f"GGUF conversion lost weights: {result.missing_keys[:5]}")
        fresh.save_pretrained(target)
        tokenizer.save_pretrained(target)
    _strip_quantization(target / "config.json")


def copy_tokenizer(source: Path, target: Path) -> None:
    """Take the tokenizer files of an HF folder (or the folder of a tokenizer file)."""
    folder = source if source.is_dir() else source.parent
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            shutil.copy2(folder / name, target / name)


def _plain_config(config) -> dict:
    data = config.to_dict()
    data.pop("quantization_config", None)
    data.pop("_name_or_path", None)
    data.pop("_model_name_or_path", None)
    return data


def _strip_quantization(config_path: Path) -> None:
    data = json.loads(config_path.read_text())
    data.pop("quantization_config", None)
    data.pop("_model_name_or_path", None)
    config_path.write_text(json.dumps(data, indent=2))
