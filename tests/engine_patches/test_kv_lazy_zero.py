"""The CPU KV cache mapped zeroed instead of written at boot (`engine_patches.kv_lazy_zero`):
the same zeros and size, anything else left to torch, the plugin declared and applied to the
pinned engine. Boot time with and without it: docs/benchmarks.md ("Cold start")."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from podium.engine_patches import kv_lazy_zero

ROOT = Path(__file__).resolve().parents[2]


def test_a_large_int8_cpu_buffer_is_mapped_zeroed_and_writable() -> None:
    shim = kv_lazy_zero._Torch(torch)
    size = kv_lazy_zero.MIN_BYTES
    buf = shim.zeros(size, dtype=torch.int8, device=torch.device("cpu"))
    assert buf.shape == (size,) and buf.dtype == torch.int8
    assert not buf.is_shared() and int(buf[:: 4096].abs().sum()) == 0  # zero on every page
    buf[-1] = 7  # writable; views over it see writes
    assert int(buf.view(-1, 1024)[-1, -1]) == 7
    # anything else is torch's own zeros
    small = shim.zeros(16, dtype=torch.int8)
    assert small.shape == (16,) and int(small.sum()) == 0
    other = shim.zeros((4, 4), dtype=torch.float32)
    assert other.dtype == torch.float32 and shim.float32 is torch.float32


def test_the_wrapped_allocation_uses_the_mapping_only_on_cpu_and_only_for_the_call() -> None:
    module = SimpleNamespace(torch=torch)
    seen: list[Any] = []

    def allocate(config: Any, device: Any, *rest: Any) -> Any:
        seen.append(module.torch)
        return module.torch.zeros(kv_lazy_zero.MIN_BYTES, dtype=torch.int8, device=device)

    wrapped = kv_lazy_zero.wrap(allocate, module)
    buf = wrapped(None, torch.device("cpu"), "layout")
    assert isinstance(seen[0], kv_lazy_zero._Torch) and module.torch is torch  # restored
    assert int(buf[:4096].sum()) == 0
    assert wrapped._podium_kv_lazy_zero


def test_the_plugin_is_declared_and_patches_the_pinned_engine(monkeypatch) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins["podium_kv_lazy_zero"] == "podium.engine_patches.kv_lazy_zero:register"
    assert kv_lazy_zero.applies()
    from vllm.v1.worker import gpu_model_runner, utils

    monkeypatch.setattr(utils, "allocate_kv_cache", utils.allocate_kv_cache)
    monkeypatch.setattr(gpu_model_runner, "allocate_kv_cache", gpu_model_runner.allocate_kv_cache)
    kv_lazy_zero.register()
    assert getattr(utils.allocate_kv_cache, "_podium_kv_lazy_zero", False)
    assert gpu_model_runner.allocate_kv_cache is utils.allocate_kv_cache
    monkeypatch.setenv("PODIUM_KV_LAZY_ZERO", "0")  # the operator's off switch
    assert not kv_lazy_zero.applies()
