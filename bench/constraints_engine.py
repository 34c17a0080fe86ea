"""End to end on the engine: decode throughput with a ``choice`` constraint, side by side.

One vLLM engine (SmolLM2, the Podium processor installed) serves the same chat prompts three
ways at a fixed concurrency: unconstrained, Podium's ``choice`` over 10,000 titles, and vLLM's own
``structured_outputs`` ``choice`` over the same titles. Each mode is warmed up first (vLLM's
grammar compile and Podium's trie build are reported separately), then timed in ``--rounds``
rounds that run every mode in turn, so a slow minute on a shared machine hits all of them;
throughput is generated tokens per second of wall time, every request decoding exactly
``--max-tokens``; ratios are reported per round and for the medians.

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 python -m bench.constraints_engine
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from tests.support.catalog import make_titles

from podium.package.defaults import default_model_dir


def _run(llm: Any, params: Any, prompts: list[list[dict[str, str]]]) -> tuple[float, int, list]:
    t0 = time.perf_counter()
    outs = llm.chat(prompts, sampling_params=params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs), outs



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("PODIUM_TEST_MODEL_DIR"),
                    help="HF folder of the model (default: the default model, from the cache)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--titles", type=int, default=10_000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed rounds; each runs every mode once, in turn")
    args = ap.parse_args()
    args.model = args.model or str(default_model_dir())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from podium.constraints import engine_logits_processors, to_vllm_xargs, validate_constraint

    titles = make_titles(args.titles)
    llm = LLM(model=args.model, logits_processors=engine_logits_processors(), enforce_eager=True,
              max_num_seqs=args.concurrency, max_model_len=512, seed=0)
    prompts = [[{"role": "user", "content": f"Recommend one movie for evening {i}."}]
               for i in range(args.requests)]
    # every mode decodes exactly max_tokens tokens (ignore_eos): a finished constraint allows
    # only EOS, which the engine then keeps sampling, so per-step cost is compared like for like
    base = {"temperature": 1.0, "max_tokens": args.max_tokens, "ignore_eos": True}
    modes = {
        "unconstrained": SamplingParams(**base),
        "podium choice": SamplingParams(**base, extra_args=to_vllm_xargs(
            validate_constraint({"type": "choice", "choices": titles}))),
        "vllm structured_outputs choice": SamplingParams(
            **base, structured_outputs=StructuredOutputsParams(choice=titles)),
    }
    print(f"{args.requests} requests at concurrency {args.concurrency}, {len(titles)} titles, "
          f"{args.rounds} rounds (modes interleaved)")
    for name, params in modes.items():
        warm, _, _ = _run(llm, params, prompts[:2])
        print(f"{name:<32} warm-up (first use) {warm:6.2f} s", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in modes}
    for rnd in range(args.rounds):
        for name, params in modes.items():
            elapsed, tokens, outs = _run(llm, params, prompts)
            valid = sum(o.outputs[0].text in set(titles) for o in outs)
            rates[name].append(tokens / elapsed)
            print(f"round {rnd + 1} {name:<32} {tokens:5d} tokens in {elapsed:6.2f} s = "
                  f"{tokens / elapsed:7.1f} tok/s  ({valid}/{len(outs)} outputs are titles)",
                  flush=True)
        un, ours, theirs = (r[-1] for r in rates.values())
        print(f"round {rnd + 1}: podium / unconstrained = {ours / un:.2f}; "
              f"podium / vllm structured = {ours / theirs:.2f}", flush=True)
    un, ours, theirs = (statistics.median(r) for r in rates.values())
    print(f"medians: podium / unconstrained = {ours / un:.2f}; podium / vllm structured = "
          f"{ours / theirs:.2f}")
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
