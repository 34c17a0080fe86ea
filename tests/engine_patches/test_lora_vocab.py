"""vLLM's vocabulary LoRA layers (embedding, logits) skip their ops while no slot holds weights
there, and only then: the record is kept at set_lora / reset_lora (vLLM's classes, built
without a model), the ops are vLLM's CPU wrapper's, checked against the plain definition. The
real engine's answers are tests/backends/vllm/test_lora_real.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from podium.engine_patches import lora_slots, lora_vocab

MAX_LORAS, RANK, HIDDEN, VOCAB = 4, 16, 24, 40
INDICES = [1, -1, 2, 1, 0]  # slot per token (-1: the base); slot s holds adapter id s + 1


def test_a_skipping_op_runs_unless_its_stack_is_tracked_empty() -> None:
    calls = []

    def op(self, y, x, b):
        calls.append(b)

    skipping = lora_vocab.skipping_empty(op, 2)
    untracked, empty, live = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    setattr(empty, lora_vocab.LIVE, frozenset())
    setattr(live, lora_vocab.LIVE, frozenset({3}))
    for b in (untracked, empty, live):
        skipping(None, None, None, b)
    skipping(None, None, None, lora_b_stacked=empty)
    assert [id(b) for b in calls] == [id(untracked), id(live)]


@pytest.fixture(scope="module")
def wrapper():
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    lora_slots.register()  # the plugin: the -1 fix, the per-module ops, this patch
    lora_vocab.patch()  # a second call does nothing
    return PunicaWrapperCPU(64, 16, device="cpu")


def _step(wrapper, prefill: bool) -> None:
    from vllm.lora.layers.utils import LoRAMapping

    ids = tuple(slot + 1 for slot in INDICES)
    wrapper.update_metadata(LoRAMapping(ids, ids, is_prefill=prefill), [1, 2, 3, 4],
                            MAX_LORAS, VOCAB)


def _layer(kind: str):
    """vLLM's own layer class, its stacks created by its create_lora_weights, without a model
    (the base layer a stand-in with the sizes it reads)."""
    from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA
    from vllm.lora.layers.vocab_parallel_embedding import VocabParallelEmbeddingWithLoRA

    cls = {"logits": LogitsProcessorWithLoRA, "embedding": VocabParallelEmbeddingWithLoRA}[kind]
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.base_layer = SimpleNamespace(vocab_size=VOCAB, org_vocab_size=VOCAB,
                                       embedding_dim=HIDDEN, weight=torch.zeros(1))
    layer.hidden_size, layer.device, layer.sharded_to_full_mapping = HIDDEN, "cpu", None
    config = SimpleNamespace(max_lora_rank=RANK, lora_dtype=torch.float32)
    layer.create_lora_weights(MAX_LORAS, config)
    return layer


def _adapter(kind: str, seed: int):
    """One adapter's weights for the layer, as vLLM's set_lora takes them."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "logits":  # lora_a [rank, hidden], lora_b [vocab, rank]
        return torch.randn(8, HIDDEN, generator=gen), torch.randn(VOCAB, 8, generator=gen)
    # embedding: lora_a [rank, vocab] (stored transposed), lora_b [hidden, rank]
    return torch.randn(8, VOCAB, generator=gen), torch.randn(HIDDEN, 8, generator=gen)


def _run(wrapper, layer, kind: str, y, x):
    """The layer's punica op as vLLM's layer calls it; returns the new y."""
    out = y.clone()
    if kind == "logits":
        wrapper.add_lora_logits(out, x, layer.lora_a_stacked, layer.lora_b_stacked, 1.0)
    else:  # x: the tokens' rows of A (the layer gathers them with F.embedding)
        wrapper.add_lora_embedding(out, x, layer.lora_b_stacked, add_input=True)
    return out


def _definition(layer, kind: str, y, x):
    out = y.clone()
    for t, slot in enumerate(INDICES):
        if slot < 0:
            continue
        if kind == "logits":
            h = x[t] @ layer.lora_a_stacked[slot, 0].T
            out[t] += h @ layer.lora_b_stacked[slot, 0].T
        else:
            out[t] += x[t] @ layer.lora_b_stacked[slot, 0].T
    return out


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
@pytest.mark.parametrize("kind", ["logits", "embedding"])
def test_a_vocab_layer_skips_while_empty_and_computes_from_a_load_until_its_reset(
        wrapper, kind: str, prefill: bool) -> None:
    layer = _layer(kind)
    _step(wrapper, prefill)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(len(INDICES), HIDDEN if kind == "logits" else RANK, generator=gen)
    y = torch.randn(len(INDICES), VOCAB if kind == "logits" else HIDDEN, generator=gen)
    assert lora_vocab.live_slots(layer.lora_b_stacked) == frozenset()
    # an adapter without weights here: vLLM resets the slot (or writes zeros)
    layer.reset_lora(1)
    layer.set_lora(2, *(torch.zeros_like(w) for w in _adapter(kind, 0)))
    assert lora_vocab.live_slots(layer.lora_b_stacked) == frozenset()
    # skipped, not computed: weights written behind set_lora's back are not looked for
    layer.lora_b_stacked[1].fill_(1.0)
    layer.lora_a_stacked[1].fill_(1.0)
    assert torch.equal(_run(wrapper, layer, kind, y, x), y)
    layer.reset_lora(1)
    # an adapter with weights here: computed from its load on, as the definition says
    layer.set_lora(1, *_adapter(kind, 1))
    assert lora_vocab.live_slots(layer.lora_b_stacked) == frozenset({1})
    out = _run(wrapper, layer, kind, y, x)
    torch.testing.assert_close(out, _definition(layer, kind, y, x))
    assert not torch.equal(out[0], y[0]) and torch.equal(out[[1, 2, 4]], y[[1, 2, 4]])
    layer.set_lora(2, *_adapter(kind, 2))
    layer.reset_lora(1)
    assert lora_vocab.live_slots(layer.lora_b_stacked) == frozenset({2})
    out = _run(wrapper, layer, kind, y, x)
    torch.testing.assert_close(out, _definition(layer, kind, y, x))
    assert not torch.equal(out[2], y[2]) and torch.equal(out[[0, 1, 3, 4]], y[[0, 1, 3, 4]])
    # the slot reset: empty again, skipped again
    layer.reset_lora(2)
    assert lora_vocab.live_slots(layer.lora_b_stacked) == frozenset()
    layer.lora_b_stacked[2].fill_(1.0)  # (as above: proves the op did not run)
    layer.lora_a_stacked[2].fill_(1.0)
    assert torch.equal(_run(wrapper, layer, kind, y, x), y)
