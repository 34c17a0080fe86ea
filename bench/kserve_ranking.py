"""Ranking: 32 candidates against one 256-token context, Podium's prefill-only scoring vs the
same scores from `vllm serve` through 32 `/v1/completions` calls (echo + logprobs, max_tokens 1).

    python -m bench.kserve_ranking --model ~/.podium/cache/<digest>/model   # a materialized HF dir

Starts a real engine twice (the reference server, then an in-process AsyncLLM), one after the
other, never together; each side is timed on its scoring calls only, after a warm-up round.
Prints both wall times, their ratio, and the largest score difference between the two.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid

import numpy as np

from bench.harness import free_port, loopback_client, serve

WORDS = ["river", "stone", "market", "lantern", "orbit", "velvet", "harbor", "signal",
         "meadow", "copper", "thunder", "garden", "pixel", "summit", "canvas"]


def make_inputs(tokenizer, context_tokens: int, num_candidates: int
                ) -> tuple[str, list[str]]:
    rng = np.random.default_rng(0)
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words))) < context_tokens:
        words.append(str(rng.choice(WORDS)))
    context = " ".join(words)
    candidates = []
    for _ in range(num_candidates):
        size = int(rng.integers(8, 17))
        candidate = " " + " ".join(str(w) for w in rng.choice(WORDS, size))
        ids = tokenizer.encode(candidate, add_special_tokens=False)[:size]
        candidates.append(tokenizer.decode(ids))
    return context, candidates


async def reference_scores(port: int, model: str, tokenizer, context: str,
                           candidates: list[str]) -> tuple[float, list[float]]:
    """32 concurrent completions with echo: sum the logprobs of each candidate's tokens."""
    context_len = len(tokenizer.encode(context))
    async with loopback_client(f"http://127.0.0.1:{port}", timeout=600) as client:
        async def one(candidate: str) -> float:
            ids = tokenizer.encode(context) + tokenizer.encode(candidate,
                                                                add_special_tokens=False)
            reply = await client.post("/v1/completions", json={
                "model": model, "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1,
                "temperature": 0})
            reply.raise_for_status()
            logprobs = reply.json()["choices"][0]["logprobs"]["token_logprobs"]
            return float(sum(logprobs[context_len:len(ids)]))

        await client.post("/v1/completions", json={  # warm-up, on another prompt
            "model": model, "prompt": "warm up " * 40, "max_tokens": 1})
        started = time.perf_counter()
        sums = await asyncio.gather(*(one(c) for c in candidates))
        return time.perf_counter() - started, list(sums)


async def podium_scores(model: str, context: str, candidates: list[str]
                        ) -> tuple[float, list[float]]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from podium.backends.base import InferenceRequest, Tensor
    from podium.backends.vllm import scoring as vllm_scoring

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=model, enforce_eager=True, enable_prefix_caching=True, max_model_len=2048))

    def request(items: list[str], text: str = context) -> InferenceRequest:
        ctx = np.array([text.encode()], dtype=object)
        cands = np.empty(len(items), dtype=object)
        cands[:] = [c.encode() for c in items]
        return InferenceRequest({"context": Tensor("context", "BYTES", ctx),
                                 "candidates": Tensor("candidates", "BYTES", cands)},
                                id=uuid.uuid4().hex)

    try:
        # warm-up on another context, so the timed run finds nothing of its own cached
        await vllm_scoring.score(engine, request(candidates[:4], "warm up " * 40))
        started = time.perf_counter()
        response = await vllm_scoring.score(engine, request(candidates))
        elapsed = time.perf_counter() - started
    finally:
        engine.shutdown()
    return elapsed, response.outputs[0].data.tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a materialized HF model directory")
    parser.add_argument("--context-tokens", type=int, default=256)
    parser.add_argument("--candidates", type=int, default=32)
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    context, candidates = make_inputs(tokenizer, args.context_tokens, args.candidates)

    port = free_port()
    with serve([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                args.model, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
                "--max-model-len", "2048"], f"http://127.0.0.1:{port}/health", timeout_s=600,
               poll_s=1):
        reference_s, reference = asyncio.run(reference_scores(port, args.model, tokenizer,
                                                              context, candidates))
    podium_s, ours = asyncio.run(podium_scores(args.model, context, candidates))
    print(f"vllm serve, {len(candidates)} completions: {reference_s:.3f} s")
    print(f"podium prefill-only scoring:     {podium_s:.3f} s")
    print(f"ratio (vllm serve / podium):     x{reference_s / podium_s:.2f}")
    worst = max(abs(a - b) for a, b in zip(reference, ours, strict=True))
    print(f"largest |score difference|:      {worst:.4f}")


if __name__ == "__main__":
    main()
