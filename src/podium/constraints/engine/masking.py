"""Writing a batch's allowed tokens into its logits, on the logits' own device."""

from __future__ import annotations

import numpy as np
import torch

from podium.constraints import kernels


def keep_only(logits: torch.Tensor, rows: np.ndarray, keep_rows: np.ndarray,
              keep_tokens: np.ndarray) -> torch.Tensor:
    """Set every logit of ``rows`` to -inf except the ``(keep_rows[i], keep_tokens[i])`` pairs.

    One write pass over the constrained rows (the floor for any dense mask) plus a gather and
    scatter of the kept entries; only the small index arrays travel to the device. On the CPU
    the three happen row by row in one compiled loop.
    """
    if len(rows) == 0:
        return logits
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
        # row by row in compiled code: kept values never leave the cache
        kernels.keep_only_rows(logits.numpy(), rows, keep_rows, keep_tokens)
        return logits
    width = logits.shape[1]
    flat = torch.from_numpy(keep_rows * width + keep_tokens).to(logits.device, non_blocking=True)
    target = logits if logits.is_contiguous() else logits.contiguous()
    view = target.view(-1)
    kept = view.index_select(0, flat)
    if len(rows) == target.shape[0]:
        target.fill_(float("-inf"))
    else:
        target.index_fill_(0, torch.from_numpy(rows).to(logits.device, non_blocking=True),
                           float("-inf"))
    view.index_copy_(0, flat, kept)
    if target is not logits:
        logits.copy_(target)
    return logits
