"""Measured engine rates the admission and deadline tests share."""

from __future__ import annotations

from podium.backends.vllm import admission

RATES = admission.Rates(prefill_tokens_per_s=1000.0, prefill_tokens=256, prefill_s=0.5,
                        decode_tokens_per_s=80.0, batch=8, decode_s=1.5)
"""A small CPU engine: 1,000 prompt tokens/s, 80 output tokens/s over 8 sequences."""
