"""A fake AsyncLLM with a measurable speed, for the admission probe's tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any


class TimedEngine:
    """A fake AsyncLLM whose prefill takes `prefill_s_per_token` a prompt token and whose
    decode step takes `step_s` for the whole batch."""

    def __init__(self, prefill_s_per_token: float = 1e-4, step_s: float = 0.01) -> None:
        self.prefill_s_per_token, self.step_s = prefill_s_per_token, step_s
        self.model_config = SimpleNamespace(max_model_len=2048, get_vocab_size=lambda: 49152)
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=256))
        self.prompts: list[list[int]] = []
        self.output_processor = SimpleNamespace(request_states={})
        """Requests in flight by id, as vLLM's output processor keeps them."""

    async def generate(self, prompt: dict[str, Any], params: Any, request_id: str
                       ) -> AsyncIterator[Any]:
        ids = prompt["prompt_token_ids"]
        self.prompts.append(ids)
        self.output_processor.request_states[f"{request_id}-0001"] = params
        try:
            await asyncio.sleep(len(ids) * self.prefill_s_per_token)
            for made in range(1, params.max_tokens + 1):
                if made > 1:
                    await asyncio.sleep(self.step_s)
                yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(made)))])
        finally:  # finished or aborted (its stream cancelled)
            self.output_processor.request_states.pop(f"{request_id}-0001", None)

    async def encode(self, prompt: dict[str, Any], params: Any, request_id: str
                     ) -> AsyncIterator[Any]:
        await asyncio.sleep(len(prompt["prompt_token_ids"]) * self.prefill_s_per_token)
        yield SimpleNamespace()
