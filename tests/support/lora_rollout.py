"""LoRA adapter rollouts on the real LLM behind a `podium up` (tests/control/test_e2e_llm.py):
whether the instance side of issue 30 is there, the base package with LoRA on, adapter
packages, and an adapter version whose files stop loading."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import httpx

from podium.package.cache import ModelCache
from podium.package.package import write_manifest


def with_lora(package: Path) -> Path:
    """The LLM package at `package` with LoRA adapters on (the default settings)."""
    manifest = json.loads((package / "podium.json").read_text())
    return write_manifest(package, {**manifest, "lora": {}}).root


def adapter_package(root: Path, name: str, version: str, base: str, seed: int) -> Path:
    """A random rank-8 adapter of `base` (its answers differ from the base's)."""
    from tests.support.lora_adapters import write_adapter_package

    return write_adapter_package(root / f"{name}-{version}", name, seed=seed, version=version,
                                 base=base)


def break_stored_adapter(base: str, name: str, version: str) -> Path:
    """Cut the announced adapter's weights in the model cache after their header, so that
    the instance's checks (which read the header) pass and the engine's load fails, as a file
    gone bad on disk would; returns its folder, to remove."""
    index = ModelCache().root / "adapters" / base / f"{name}@{version}.json"
    folder = ModelCache().root / "objects" / json.loads(index.read_text())["key"]
    weights = folder / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:8 + struct.unpack("<Q", data[:8])[0]])
    return folder


def forget_stored_adapter(folder: Path) -> None:
    """Remove a broken adapter's object from the shared cache (no later test may reuse it)."""
    shutil.rmtree(folder, ignore_errors=True)


def rollout(api: str, model: str, version: str, **config: object) -> int:
    """Start a rollout through the API; its id."""
    answer = httpx.post(api + "/v1/rollouts", timeout=30,
                        json={"model": model, "version": version, **config})
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])
