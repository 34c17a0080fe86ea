"""The mask write: compiled row loop (CPU float32) and torch path (anything else) agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from podium.constraints.engine.masking import keep_only


def _expected(logits: torch.Tensor, rows: np.ndarray, keep_rows: np.ndarray,
              keep_tokens: np.ndarray) -> torch.Tensor:
    out = logits.clone()
    for r in rows.tolist():
        kept = {int(t) for rr, t in zip(keep_rows, keep_tokens, strict=True) if rr == r}
        for t in range(out.shape[1]):
            if t not in kept:
                out[r, t] = float("-inf")
    return out


@pytest.mark.parametrize("layout", ["float32", "bfloat16", "non-contiguous"])
def test_only_kept_logits_survive_in_masked_rows(layout: str) -> None:
    rng = np.random.default_rng(0)
    base = torch.randn(6, 300)
    if layout == "bfloat16":
        base = base.to(torch.bfloat16)
    logits = base.t().contiguous().t() if layout == "non-contiguous" else base.clone()
    rows = np.array([0, 2, 3, 5], dtype=np.int64)  # rows 1 and 4 carry no constraint
    keep_rows = np.array([0, 0, 2, 3, 3, 3, 5, 5], dtype=np.int64)  # row 5: a token twice
    keep_tokens = np.array([7, 299, 0, 1, 150, 2, 42, 42], dtype=np.int64)
    rng.shuffle(order := np.arange(len(keep_rows)))  # pairs may come in any order
    expected = _expected(base, rows, keep_rows, keep_tokens)

    out = keep_only(logits, rows, keep_rows[order], keep_tokens[order])

    assert out.data_ptr() == logits.data_ptr()  # in place
    assert torch.equal(out, expected)
    assert torch.equal(out[[1, 4]], base[[1, 4]])


def test_a_row_with_nothing_kept_is_all_minus_infinity() -> None:
    logits = torch.randn(3, 50)
    out = keep_only(logits, np.array([1]), np.zeros(0, dtype=np.int64),
                    np.zeros(0, dtype=np.int64))
    assert torch.isneginf(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
