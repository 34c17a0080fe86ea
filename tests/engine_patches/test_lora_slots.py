"""The LoRA slot fix on vLLM's own CPU LoRA ops: a token marked -1 (no adapter) gets nothing
from the last slot, and tokens with an adapter get exactly what the unpatched op gives them.
The full mixed batch on the real engine is tests/backends/vllm/test_lora_real.py."""

from __future__ import annotations

import pytest
import torch

from podium.engine_patches import lora_slots

SLOTS, RANK, WIDTH, OUT = 3, 4, 16, 12


@pytest.fixture(scope="module")
def ops():
    from vllm.lora.ops.torch_ops import lora_ops

    original = {name: getattr(lora_ops, name) for name in lora_slots.PATCHED_OPS}
    original = {name: getattr(op, "__wrapped__", op) for name, op in original.items()}
    return original


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(4, WIDTH, generator=gen)
    shrink_weights = torch.randn(SLOTS, 1, RANK, WIDTH, generator=gen)  # every slot filled
    expand_weights = torch.randn(SLOTS, 1, OUT, RANK, generator=gen)
    indices = torch.tensor([0, -1, 2, -1])
    return inputs, shrink_weights, expand_weights, indices


def test_the_unpatched_ops_apply_the_last_slot_to_tokens_without_an_adapter(ops) -> None:
    inputs, shrink_weights, _, indices = _batch()
    out = torch.zeros(4, RANK)
    ops["bgmv_shrink"](inputs, shrink_weights, out, indices, 1.0)
    assert out[1].abs().sum() > 0  # the fault this patch exists for


def test_shrink_gives_nothing_to_tokens_without_an_adapter_and_the_same_to_the_rest(ops) -> None:
    inputs, shrink_weights, _, indices = _batch()
    fixed = lora_slots.skipping_unassigned(ops["bgmv_shrink"])
    out, reference = torch.zeros(4, RANK), torch.zeros(4, RANK)
    fixed(inputs, shrink_weights, out, indices, 0.5)
    ops["bgmv_shrink"](inputs, shrink_weights, reference, indices, 0.5)
    assert torch.equal(out[[1, 3]], torch.zeros(2, RANK))
    assert torch.equal(out[[0, 2]], reference[[0, 2]])


@pytest.mark.parametrize("op", ["bgmv_expand", "bgmv_expand_slice"])
def test_expand_adds_nothing_to_tokens_without_an_adapter(ops, op: str) -> None:
    _, _, expand_weights, indices = _batch()
    buffer = torch.randn(4, RANK)
    base = torch.randn(4, OUT + 4)
    extra = (2, OUT) if op == "bgmv_expand_slice" else ()
    out, reference = base.clone(), base.clone()
    lora_slots.skipping_unassigned(ops[op])(buffer, expand_weights, out, indices, *extra, True)
    ops[op](buffer, expand_weights, reference, indices, *extra, True)
    assert torch.equal(out[[1, 3]], base[[1, 3]])  # untouched: no adapter
    assert torch.equal(out[[0, 2]], reference[[0, 2]])


@pytest.mark.parametrize("op", ["bgmv_shrink", "bgmv_expand"])
def test_a_batch_without_any_adapter_skips_the_op_with_the_same_result(ops, op: str) -> None:
    inputs, shrink_weights, expand_weights, _ = _batch()
    none = torch.full((4,), -1)
    if op == "bgmv_shrink":
        args, out = (inputs, shrink_weights), torch.full((4, RANK), 7.0)
        extra: tuple = (1.0,)
    else:
        args, out = (torch.randn(4, RANK), expand_weights), torch.randn(4, OUT)
        extra = (True,)
    expected = torch.zeros(4, RANK) if op == "bgmv_shrink" else out.clone()
    lora_slots.skipping_unassigned(ops[op], shrink=op == "bgmv_shrink")(*args, out, none, *extra)
    assert torch.equal(out, expected)


def test_a_batch_without_unassigned_tokens_takes_the_original_op(ops) -> None:
    inputs, shrink_weights, _, _ = _batch()
    calls = []

    def op(*args, **kwargs):
        calls.append(args[0])
        return ops["bgmv_shrink"](*args, **kwargs)

    lora_slots.skipping_unassigned(op)(inputs, shrink_weights, torch.zeros(4, RANK),
                                       torch.tensor([0, 1, 2, 0]), 1.0)
    assert calls[0] is inputs


def test_patch_reaches_every_module_holding_the_ops_once(ops) -> None:
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    assert lora_slots.applies()  # the installed engine is the pinned one
    lora_slots.patch()
    lora_slots.patch()
    for name in lora_slots.PATCHED_OPS:
        assert getattr(getattr(lora_ops, name), "__wrapped__", None) is ops[name]
        assert getattr(punica_cpu, name) is getattr(lora_ops, name)


def _slot_batch(seed: int, dtype: torch.dtype, four_d: bool, rows: int = 9):
    gen = torch.Generator().manual_seed(seed)
    shape = (SLOTS, 1) if four_d else (SLOTS,)
    inputs = torch.randn(rows, WIDTH, generator=gen).to(dtype)
    shrink_weights = torch.randn(*shape, RANK, WIDTH, generator=gen).to(dtype)
    expand_weights = torch.randn(*shape, OUT, RANK, generator=gen).to(dtype)
    indices = torch.randint(0, SLOTS, (rows,), generator=gen)
    return inputs, shrink_weights, expand_weights, indices


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("four_d", [True, False], ids=["stacked-4d", "stacked-3d"])
@pytest.mark.parametrize("add_inputs", [True, False], ids=["add", "write"])
def test_the_ops_by_slot_give_what_the_stock_ops_give(ops, dtype: torch.dtype, four_d: bool,
                                                      add_inputs: bool) -> None:
    """One matmul per adapter in the batch instead of a copy of the weights per token: the
    same products (within the dtype's rounding), the same writes, for every slot mix."""
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else \
        {"atol": 0.1, "rtol": 0.02}
    for seed, same_slot in ((0, False), (1, True)):
        inputs, shrink_weights, expand_weights, indices = _slot_batch(seed, dtype, four_d)
        if same_slot:
            indices = torch.full_like(indices, 1)
        buffer, reference = torch.zeros(len(indices), RANK), torch.zeros(len(indices), RANK)
        lora_slots.shrink_by_slot(inputs, shrink_weights, buffer, indices, 0.5)
        ops["bgmv_shrink"](inputs, shrink_weights, reference, indices, 0.5)
        torch.testing.assert_close(buffer, reference, **tolerance)
        base = torch.randn(len(indices), OUT + 4).to(dtype)
        out, expected = base.clone(), base.clone()
        lora_slots.expand_by_slot(reference, expand_weights, out, indices, add_inputs)
        ops["bgmv_expand"](reference, expand_weights, expected, indices, add_inputs)
        torch.testing.assert_close(out, expected, **tolerance)
        out, expected = base.clone(), base.clone()
        lora_slots.expand_slice_by_slot(reference, expand_weights, out, indices, 2, OUT,
                                        add_inputs)
        ops["bgmv_expand_slice"](reference, expand_weights, expected, indices, 2, OUT,
                                 add_inputs)
        torch.testing.assert_close(out, expected, **tolerance)


def test_the_patched_ops_go_by_slot_and_give_rows_without_an_adapter_nothing(ops) -> None:
    inputs, shrink_weights, expand_weights, indices = _batch()
    fixed = {name: lora_slots.skipping_unassigned(ops[name], shrink=name == "bgmv_shrink",
                                                  by_slot=lora_slots.BY_SLOT[name])
             for name in lora_slots.PATCHED_OPS}
    buffer, reference = torch.zeros(4, RANK), torch.zeros(4, RANK)
    fixed["bgmv_shrink"](inputs, shrink_weights, buffer, indices, 1.0)
    ops["bgmv_shrink"](inputs, shrink_weights, reference, indices.clamp(min=0), 1.0)
    assert torch.equal(buffer[[1, 3]], torch.zeros(2, RANK))
    torch.testing.assert_close(buffer[[0, 2]], reference[[0, 2]])
    base = torch.randn(4, OUT)
    out = base.clone()
    fixed["bgmv_expand"](reference, expand_weights, out, indices, True)
    assert torch.equal(out[[1, 3]], base[[1, 3]])  # untouched: no adapter
    assert not torch.equal(out[[0, 2]], base[[0, 2]])
    # the stock op, not by slot, where rows and indices differ in number (no vLLM call site)
    calls = []

    def op(*args, **kwargs):
        calls.append(args[0])
        return ops["bgmv_shrink"](*args, **kwargs)

    by_slot = lora_slots.skipping_unassigned(op, shrink=True, by_slot=lora_slots.shrink_by_slot)
    by_slot(inputs[:1], shrink_weights, torch.zeros(1, RANK), torch.tensor([1]), 1.0)
    assert calls == []
    by_slot(inputs[:1], shrink_weights, torch.zeros(2, RANK), torch.tensor([1, 2]), 1.0)
    assert len(calls) == 1
