"""LoRA on vLLM's CPU build: the vocabulary's LoRA ops skipped while no slot has weights there.

With LoRA on and no `target_modules` in the engine's LoRA config, vLLM wraps every supported
module, the vocabulary's too: the input embedding (`VocabParallelEmbeddingWithLoRA`, an
expand [tokens, rank] x [rank, hidden] per slot in the batch, every step) and the logits
(`LogitsProcessorWithLoRA`, a shrink and an expand over the whole vocabulary per slot, every
step). Nearly every PEFT adapter, those of this project's tests and benchmarks included,
targets linear modules only: for them vLLM writes zeros into these layers' stacks
(`reset_lora`), and the two ops add zeros to every token, each step.

Here each of the two layers records which slots hold non-zero weights, when vLLM writes them
(`set_lora`: the adapter's own small A and B, looked at once per adapter load; `reset_lora`,
`create_lora_weights`: none), never by scanning the stacks per step; the record lives on the
layer's stacked B (`lora_b_stacked`), the tensor both ops are handed. `PunicaWrapperCPU`'s
`add_lora_embedding` and `add_lora_logits` return at once for a stack no slot has weights in.
Adding zeros is exact, so a skipped op changes no value: an adapter with embedding or lm_head
weights turns the op back on from its load until its slot is reset.

Installed by `lora_slots.register` (the same vLLM general plugin), for the pinned version.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("podium.engine_patches")
_MARK = "_podium_lora_vocab"
LIVE = "_podium_live_slots"
"""On a vocab layer's `lora_b_stacked`: the slots whose weights are not all zero (a frozenset);
absent where this patch did not see the stack written (the op then runs)."""


def has_weights(lora_a: Any, lora_b: Any) -> bool:
    """Whether `x @ A.T @ B.T` can be non-zero: both sides hold a non-zero value."""
    return bool(lora_a.ne(0).any()) and bool(lora_b.ne(0).any())


def live_slots(stacked_b: Any) -> frozenset[int] | None:
    """The slots with weights in this stack, or None where not tracked (see LIVE)."""
    return getattr(stacked_b, LIVE, None)


def _mark(layer: Any, slot: int | None, live: bool) -> None:
    """Record `slot` as holding weights (`live`) or not; `slot` None: every slot empty."""
    stacked = getattr(layer, "lora_b_stacked", None)
    if stacked is None:
        return
    slots = set(live_slots(stacked) or ()) if slot is not None else set()
    if slot is not None:
        (slots.add if live else slots.discard)(int(slot))
    setattr(stacked, LIVE, frozenset(slots))


def track(cls: Any) -> None:
    """Wrap a vocab LoRA layer class's `create_lora_weights`, `set_lora`, `reset_lora` so
    its stacked B carries the slots that hold weights."""
    stock_create, stock_set, stock_reset = cls.create_lora_weights, cls.set_lora, cls.reset_lora

    def create_lora_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = stock_create(self, *args, **kwargs)
        _mark(self, None, False)  # created as zeros
        return result

    def set_lora(self: Any, index: int, lora_a: Any, lora_b: Any, *args: Any,
                 **kwargs: Any) -> Any:
        result = stock_set(self, index, lora_a, lora_b, *args, **kwargs)
        _mark(self, index, has_weights(lora_a, lora_b))
        return result

    def reset_lora(self: Any, index: int, *args: Any, **kwargs: Any) -> Any:
        result = stock_reset(self, index, *args, **kwargs)
        _mark(self, index, False)
        return result

    for name, method in (("create_lora_weights", create_lora_weights), ("set_lora", set_lora),
                         ("reset_lora", reset_lora)):
        method.__wrapped__ = getattr(cls, name)  # type: ignore[attr-defined]
        setattr(cls, name, method)


def skipping_empty(op: Any, b_position: int) -> Any:
    """A `PunicaWrapperCPU` vocab op that returns at once when its stacked B (argument
    `b_position`, after self) is tracked and no slot holds weights in it."""

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        stacked = args[b_position] if len(args) > b_position else kwargs.get("lora_b_stacked")
        if stacked is not None and live_slots(stacked) == frozenset():
            return None  # adds zeros: nothing to do
        return op(self, *args, **kwargs)

    wrapper.__wrapped__ = op  # type: ignore[attr-defined]
    return wrapper


def patch() -> None:
    """Track the vocab layers' slots and skip their ops while empty; a second call does
    nothing."""
    from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA
    from vllm.lora.layers.vocab_parallel_embedding import VocabParallelEmbeddingWithLoRA
    from vllm.lora.punica_wrapper import punica_cpu

    cls = punica_cpu.PunicaWrapperCPU
    if getattr(cls, _MARK, False):
        return
    for layer_cls in (VocabParallelEmbeddingWithLoRA, LogitsProcessorWithLoRA):
        track(layer_cls)
    # add_lora_embedding(y, x, lora_b_stacked, ...); add_lora_logits(y, x, a, lora_b_stacked, ...)
    cls.add_lora_embedding = skipping_empty(cls.add_lora_embedding, 2)
    cls.add_lora_logits = skipping_empty(cls.add_lora_logits, 3)
    setattr(cls, _MARK, True)
    log.debug("patched vLLM's CPU vocab LoRA ops: skipped while no slot has weights")
