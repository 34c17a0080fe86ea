"""LoRA on vLLM's CPU build, per linear module in a few ops, whatever the adapter mix.

vLLM's CPU LoRA layers call `PunicaWrapperCPU.add_lora_linear` once per linear module (q/k/v,
o, gate/up, down: 4 calls in each of a Llama's layers, every step, decode included), and it
runs one shrink and one expand per packed slice, each over the step's token→slot indices
(the prefill path re-explodes them per op). Even computed by slot (`lora_slots.by_slot`: one
matmul per adapter in the batch) that is ~14 ops a layer times the adapters in the batch,
each with its indexing: on SmolLM2-135M with 8 adapters, ~420 op calls and ~3,000 small
matmuls a step, 70% of a mixed step's time for a few % of its FLOPs (docs/benchmarks.md).

Here a module is one shrink matmul and one expand matmul per slice that any adapter uses:
- per step (`StepSlots`, built by `update_metadata`): the token→slot indices and, once per
  layout, a mask [tokens, slots x rank] that is `scale` where the token's slot owns the column
  and 0 elsewhere (a token without an adapter, slot -1, has a zero row: it gets nothing);
- per module, rebuilt only when the stacked weights change (`Prepared`): the A matrices of
  every slot holding an adapter, the slices they use side by side, trimmed to the highest
  rank any of them uses (a rank-8 adapter in a rank-16 stack has zero rows beyond 8), as one
  [slices x slots x rank, in] matrix; and each used slice's B as [out, slots x rank], both
  laid out as vLLM stacks them and multiplied transposed, as the by-slot ops do (laid out
  [in, ...] the CPU's fp32 sums ran in another order: see `prepare`);
- the module: `h = (x @ A.T) * mask`, then `y[:, slice] += h[:, slice's columns] @ B.T` per
  used slice. A slice no adapter targets (k, gate, up for a q/v/o/down adapter) costs nothing.

Every slot's shrink is computed for every token and masked (no gather, no per-slot loop):
at most slots x rank extra columns per token, a few % of the base model's FLOPs here.

In a bf16/fp16 model both matmuls run in the model's dtype through oneDNN, as vLLM's CPU
build runs the base model's own linears (`vllm._custom_ops.onednn_mm`, one handler per
matrix, its weights packed once per adapter load), each rounded once to the model's dtype:
what PEFT on transformers computes (`lora_B(lora_A(x)) * scaling` in bf16, whose CPU matmuls
are oneDNN's too; vLLM folds `scaling` into B at load). For one adapter the delta is PEFT's
bit for bit (tests/engine_patches/test_lora_linear.py against PEFT's own layer); the
fp32 shrink the stock ops and the by-slot ops compute differs from it by one bf16 rounding
in a few values in 100,000, as CPU BLAS sums fp32 in an order that depends on the matrix's
width (docs/lora.md).
Where oneDNN is not there (or the model is fp32), the math runs in fp32 for small steps and in
the model's dtype for large ones, rounded where the stock ops round.

Installed by `lora_slots.register` (the same vLLM general plugin) unless the engine's
environment has `PODIUM_LORA_LINEAR=0`. A mix of slots can differ from one adapter alone by
one bf16 rounding in a few module calls, as vLLM's own kernels do between batch sizes.
A call this does not know (rows unlike the step's tokens, a 3-D input) goes to the stock
path, which keeps the -1 fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("podium.engine_patches")
_MARK = "_podium_lora_linear"


class StepSlots:
    """One step's token→slot map, shared by every LoRA module of the step."""

    def __init__(self, indices: Any, epoch: tuple[Any, ...] = ()) -> None:
        self.indices = indices.clone()
        self.tokens = int(indices.shape[0])
        self.epoch = epoch  # the slots' adapters this step (vLLM's lora_index_to_id)
        self.empty = not bool((self.indices >= 0).any())
        self._masks: dict[tuple[Any, ...], Any] = {}

    def mask(self, slots: tuple[int, ...], rank: int, parts: int, scale: float,
             dtype: Any) -> Any:
        """[tokens, parts x slots x rank]: `scale` where the token's slot is the column's."""
        key = (slots, rank, parts, scale, dtype)
        mask = self._masks.get(key)
        if mask is None:
            import torch

            owners = torch.tensor(slots, dtype=self.indices.dtype)
            onehot = (self.indices.unsqueeze(1) == owners).to(dtype)
            if scale != 1.0:
                onehot = onehot * scale
            mask = onehot.repeat_interleave(rank, dim=1).repeat(1, parts).contiguous()
            self._masks[key] = mask
        return mask


SMALL_STEP = 128
"""Up to this many tokens a step's LoRA math runs in fp32 (where the CPU's small bf16 matmuls
cost more than the conversions); above it, in the model's dtype (AMX/AVX512-BF16 matmuls)."""


@dataclass
class Prepared:
    """One module's adapters laid out for the two matmuls (see the module's doc), kept in
    fp32 and, on first use, in each other dtype the math runs in."""

    key: tuple[Any, ...]
    slots: tuple[int, ...]
    rank: int
    offsets: list[tuple[int, int]]  # (offset in y, size) per used slice
    a: Any  # [parts x slots x rank, in]
    b: list[Any]  # per used slice: [size, slots x rank]
    cast: dict[Any, tuple[Any, list[Any]]] = field(default_factory=dict)
    dnn: dict[Any, tuple[Any, list[Any]] | None] = field(default_factory=dict)

    def weights(self, dtype: Any) -> tuple[Any, list[Any]]:
        if dtype == self.a.dtype:
            return self.a, self.b
        if dtype not in self.cast:
            self.cast[dtype] = (self.a.to(dtype), [b.to(dtype) for b in self.b])
        return self.cast[dtype]

    def handlers(self, dtype: Any) -> tuple[Any, list[Any]] | None:
        """oneDNN matmul handlers for `x @ A.T` and each slice's `h @ B.T` in `dtype`
        (built on first use, once per adapter load), or None where oneDNN is not there."""
        if dtype not in self.dnn:
            self.dnn[dtype] = onednn_handlers(*self.weights(dtype))
        return self.dnn[dtype]


def prepare(lora_a: tuple[Any, ...], lora_b: tuple[Any, ...], output_slices: tuple[int, ...],
            key: tuple[Any, ...] = ()) -> Prepared | None:
    """The module's used slots and slices, or None when no slot has weights in any slice.
    `lora_a[i]` [max_loras, (1,) rank, in], `lora_b[i]` [max_loras, (1,) out_i, rank]."""
    import torch

    a_all = [a.squeeze(1) if a.dim() == 4 else a for a in lora_a]
    b_all = [b.squeeze(1) if b.dim() == 4 else b for b in lora_b]
    used = []  # per slice: [max_loras] bool, the slots with weights there
    rank = 0
    for a, b in zip(a_all, b_all, strict=True):
        rows = a.ne(0).any(dim=-1)  # [max_loras, rank]: the rank rows in use
        used.append(rows.any(dim=-1) & b.ne(0).flatten(1).any(dim=-1))
        if bool(rows.any()):
            rank = max(rank, int(rows.any(dim=0).nonzero().max()) + 1)
    in_use = torch.stack(used).any(dim=0)
    slots = tuple(int(s) for s in in_use.nonzero().flatten())
    if not slots or rank == 0:
        return None
    index = torch.tensor(slots)
    shrinks, expands, offsets, offset = [], [], [], 0
    for a, b, size, slice_used in zip(a_all, b_all, output_slices, used, strict=True):
        if bool(slice_used.any()):
            shrinks.append(a[index, :rank].reshape(len(slots) * rank, a.shape[-1]))
            expand = b[index, :size, :rank].permute(1, 0, 2).reshape(size, len(slots) * rank)
            expands.append(expand.float().contiguous())
            offsets.append((offset, size))
        offset += size
    # kept as vLLM stacks them, (out, in), and multiplied transposed (`x @ w.T`) as the
    # by-slot ops do: CPU BLAS sums a product in another order when the same weights are laid
    # out (in, out), and one bf16 rounding flipped that way in 2 of 1,920 module calls moved
    # an adapter's greedy answer off PEFT's on the real engine (docs/benchmarks.md, run 5)
    a_cat = torch.cat(shrinks).float().contiguous()
    return Prepared(key, slots, rank, offsets, a_cat, expands)


def onednn_handlers(a: Any, b: list[Any]) -> tuple[Any, list[Any]] | None:
    """vLLM's CPU oneDNN matmul handlers for `x @ a.T` and each `h @ b_i.T` (a bf16 or
    fp16 model's), or None where this build has none or they cannot be made."""
    import torch

    if a.dtype not in (torch.bfloat16, torch.float16):
        return None
    try:
        from vllm import _custom_ops as ops

        if not ops._supports_onednn:
            return None
        return (ops.create_onednn_mm(a.t(), 32),
                [ops.create_onednn_mm(b_i.t(), 32) for b_i in b])
    except (ImportError, RuntimeError, AttributeError) as error:
        log.debug("no oneDNN matmul for the LoRA ops (%s): torch's instead", error)
        return None


def apply(y: Any, x: Any, prepared: Prepared, step: StepSlots, scale: float) -> None:
    """y[:, slice] += (x @ A_slot * scale) @ B_slot for each token's slot, in place: in
    y's dtype through oneDNN where it is there (see the module's doc), else rounded as the
    stock ops round: the shrink and each slice's product to y's dtype."""
    handlers = prepared.handlers(y.dtype) if x.dtype == y.dtype else None
    if handlers is not None:
        return apply_onednn(y, x, prepared, step, scale, handlers)
    import torch

    dtype = torch.float32 if x.shape[0] <= SMALL_STEP else y.dtype
    a, _ = prepared.weights(dtype)
    _, expands = prepared.weights(y.dtype)
    mask = step.mask(prepared.slots, prepared.rank, len(expands), scale, dtype)
    h = x.to(dtype) @ a.T
    h.mul_(mask)
    h = h.to(y.dtype)
    width = len(prepared.slots) * prepared.rank
    for j, ((offset, size), b) in enumerate(zip(prepared.offsets, expands, strict=True)):
        y[:, offset:offset + size].add_(h[:, j * width:(j + 1) * width] @ b.T)


def apply_onednn(y: Any, x: Any, prepared: Prepared, step: StepSlots, scale: float,
                 handlers: tuple[Any, list[Any]]) -> None:
    """`apply` in y's dtype: one oneDNN shrink, masked (the mask is 0 or `scale`: exact for
    vLLM's 1.0), then one oneDNN expand per used slice, each rounded once, as PEFT's."""
    from vllm import _custom_ops as ops

    shrink, expands = handlers
    mask = step.mask(prepared.slots, prepared.rank, len(expands), scale, y.dtype)
    h = ops.onednn_mm(shrink, x if x.is_contiguous() else x.contiguous(), None)
    h.mul_(mask)
    width = len(prepared.slots) * prepared.rank
    for j, ((offset, size), expand) in enumerate(zip(prepared.offsets, expands, strict=True)):
        part = h if len(expands) == 1 else h[:, j * width:(j + 1) * width].contiguous()
        y[:, offset:offset + size].add_(ops.onednn_mm(expand, part, None))


def weights_key(lora_a: tuple[Any, ...], lora_b: tuple[Any, ...], epoch: tuple[Any, ...]
                ) -> tuple[Any, ...]:
    """What the prepared weights depend on: each stacked tensor's version, where torch tracks
    it (vLLM writes an adapter into the stacks in place, and zeroes a slot it frees); else
    the slots' adapters (`epoch`, vLLM's lora_index_to_id), which move with every load."""
    try:
        return tuple(t._version for t in (*lora_a, *lora_b))
    except RuntimeError:  # inference tensors keep no version
        return ("epoch", *epoch)


def patch() -> None:
    """Wrap `PunicaWrapperCPU.update_metadata` and `add_lora_linear`; a second call does
    nothing."""
    from vllm.lora.punica_wrapper import punica_cpu

    cls = punica_cpu.PunicaWrapperCPU
    if getattr(cls, _MARK, False):
        return
    stock_update = cls.update_metadata
    stock_linear = cls.add_lora_linear

    def update_metadata(self: Any, mapping: Any, lora_index_to_id: list[int | None],
                        *args: Any, **kwargs: Any) -> None:
        stock_update(self, mapping, lora_index_to_id, *args, **kwargs)
        self._podium_step = StepSlots(self.token_lora_indices, tuple(lora_index_to_id))

    def add_lora_linear(self: Any, y: Any, x: Any, lora_a_stacked: tuple[Any, ...],
                        lora_b_stacked: tuple[Any, ...], scale: float,
                        output_slices: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
        step: StepSlots | None = getattr(self, "_podium_step", None)
        if (step is None or x.dim() != 2 or y.dim() != 2 or x.shape[0] != step.tokens
                or y.shape[0] != step.tokens):
            return stock_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale,
                                output_slices, *args, **kwargs)
        if step.empty:
            return None
        cache: dict[int, Prepared | tuple[Any, ...]] = self.__dict__.setdefault(
            "_podium_prepared", {})
        key = weights_key(lora_a_stacked, lora_b_stacked, step.epoch)
        prepared = cache.get(id(lora_a_stacked[0]))
        if prepared is None or (prepared.key if isinstance(prepared, Prepared)
                                else prepared) != key:
            prepared = prepare(lora_a_stacked, lora_b_stacked, tuple(output_slices), key) or key
            cache[id(lora_a_stacked[0])] = prepared
        if isinstance(prepared, Prepared):  # else: no adapter has weights in this module
            apply(y, x, prepared, step, scale)
        return None

    cls.update_metadata = update_metadata
    cls.add_lora_linear = add_lora_linear
    setattr(cls, _MARK, True)
    log.debug("patched vLLM's CPU LoRA linear: one shrink and one expand per used slice")
