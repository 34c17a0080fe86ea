"""This machine's roofline for the default LLM, beside the tokens/s Podium achieved.

    python -m bench.roofline [--achieved TOK_S] [--threads 1] [--batch 16] [--input 128]
                             [--output 64]

Measures, on this machine: memory bandwidth (a 1 GiB copy with torch, bytes read + written,
best of 5) and GEMM throughput (bf16 and fp32 `matmul` of the decode/prefill shapes, best of
5), with `--threads` threads (1: what vLLM's CPU worker gets on a 2-core machine, one core
being reserved for the engine core). From the default model's files (config.json and the
safetensors in the cache) it takes the weights' bytes and the KV bytes per token, and prints:

- decode: each step reads every weight once plus each sequence's KV cache (context = input +
  half the output on average), for `--batch` sequences: tokens/s <= batch / (bytes / bandwidth);
- prefill: 2 FLOPs per parameter per prompt token: tokens/s <= GEMM FLOP/s / (2 x params);
- the standard load (`--batch` concurrent requests of `--input` in / `--output` out): output
  tokens/s <= output tokens / (prefill time + decode time) under both bounds at once;

and, given `--achieved` (output tokens/s measured on the same load, e.g. by `bench.boot`),
that figure as a fraction of the bound. A bound, not a prediction: attention, sampling,
scheduling and Python overhead are not in it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _best(fn, repeats: int = 5) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def bandwidth_gb_s(threads: int) -> float:
    """Bytes read + written per second copying 1 GiB (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    seconds = _best(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / seconds / 1e9


def gemm_gflop_s(threads: int, dtype: str, m: int, k: int = 576, n: int = 1536) -> float:
    """matmul (m x k) @ (k x n) FLOP/s (best of 5); the default model's hidden 576, MLP 1536."""
    import torch

    torch.set_num_threads(threads)
    kind = getattr(torch, dtype)
    a, b = torch.randn(m, k).to(kind), torch.randn(k, n).to(kind)
    reps = max(1, int(2e9 // (2 * m * k * n)))

    def run() -> None:
        for _ in range(reps):
            torch.matmul(a, b)

    return 2 * m * k * n * reps / _best(run) / 1e9


def model_figures(root: Path) -> dict[str, float]:
    """Weights' bytes, parameters and KV bytes per token of the model in `root`."""
    config = json.loads((root / "config.json").read_text())
    files = list(root.glob("*.safetensors"))
    weight_bytes = sum(f.stat().st_size for f in files)
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(
        config.get("dtype") or config.get("torch_dtype", "float32"), 4)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", config["num_attention_heads"])
    kv_per_token = 2 * config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes
    return {"weight_bytes": weight_bytes, "params": weight_bytes / dtype_bytes,
            "dtype_bytes": dtype_bytes, "kv_bytes_per_token": kv_per_token}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--achieved", type=float, default=None,
                        help="output tokens/s measured on the same load")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input", type=int, default=128)
    parser.add_argument("--output", type=int, default=64)
    args = parser.parse_args()
    from podium.package.defaults import default_model_dir

    model = model_figures(default_model_dir())
    bw = bandwidth_gb_s(args.threads)
    dtype = "bfloat16" if model["dtype_bytes"] == 2 else "float32"
    prefill_flops = gemm_gflop_s(args.threads, dtype, m=args.batch * args.input) * 1e9
    context = args.input + args.output / 2
    step_bytes = model["weight_bytes"] + args.batch * context * model["kv_bytes_per_token"]
    decode_tok_s = args.batch / (step_bytes / (bw * 1e9))
    prefill_tok_s = prefill_flops / (2 * model["params"])
    load_s = (args.batch * args.input / prefill_tok_s
              + args.output * step_bytes / (bw * 1e9))
    bound = args.batch * args.output / load_s
    print(f"model: {model['weight_bytes'] / 1e6:.0f} MB of {dtype} weights "
          f"({model['params'] / 1e6:.0f} M parameters), KV {model['kv_bytes_per_token']} B/token")
    print(f"machine ({args.threads} thread(s)): copy {bw:.1f} GB/s, {dtype} GEMM "
          f"{prefill_flops / 1e9:.1f} GFLOP/s")
    print(f"decode bound, batch {args.batch}, context {context:.0f}: {decode_tok_s:.0f} tok/s "
          f"({step_bytes / 1e6:.0f} MB read per step)")
    print(f"prefill bound: {prefill_tok_s:.0f} prompt tok/s")
    print(f"standard load ({args.batch} x {args.input} in / {args.output} out): output "
          f"<= {bound:.0f} tok/s")
    if args.achieved is not None:
        print(f"achieved {args.achieved:.1f} tok/s = {args.achieved / bound:.2f} of the bound")


if __name__ == "__main__":
    main()
