"""This machine's roofline for the default LLM, beside the tokens/s Podium achieved.

    python -m bench.roofline [--achieved TOK_S[,TOK_S]] [--threads N] [--batch 16]
                             [--loads 128/64,32/256]

Measures, on this machine: memory bandwidth (a 1 GiB copy with torch, bytes read + written,
best of 5) and GEMM throughput (bf16 or fp32 `matmul` of each load's prefill shape, best of
5), with `--threads` threads: by default the engine worker's own count, as Podium chooses it at boot
(`podium.backends.vllm.worker_threads`, `auto`: both cores of a 2-core instance). From the
default model's files (config.json and the safetensors in the cache) it takes the weights'
bytes and the KV bytes per token, and prints, for each load of `--loads` (IN/OUT: `--batch`
concurrent requests of IN prompt tokens, OUT output tokens; the standard load 128/64 and the
decode-heavy 32/256 by default):

- decode: each step reads every weight once plus each sequence's KV cache (context = input +
  half the output on average), for `--batch` sequences: tokens/s <= batch / (bytes / bandwidth);
- prefill: 2 FLOPs per parameter per prompt token: tokens/s <= GEMM FLOP/s / (2 x params);
- the load: output tokens/s <= output tokens / (prefill time + decode time) under both bounds
  at once (the roofline);

and, given `--achieved` (output tokens/s measured on the same loads, one per load, e.g. by
`bench.boot`), each as a fraction of its bound. A bound, not a prediction: attention,
sampling, scheduling and Python overhead are not in it.

Beside it (not part of the roofline), the decode step's GEMMs alone through the engine's own
kernel: every linear layer of the model (q/k/v, o, gate/up, down per layer, the LM head) at
M = `--batch` rows through vLLM's CPU GEMM (`onednn_mm` where vLLM uses it, else torch's
`linear`), each layer its own weights so they stream from memory as in a real step (best of
5 passes): the step time that kernel needs before any other work, and the tokens/s it allows.
`--no-kernel` skips it (it imports vLLM).
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


def linear_shapes(config: dict) -> list[tuple[int, int, int]]:
    """(out, in, count) of the model's linear layers in a decode step (a Llama layout)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads", heads)
    layers = config["num_hidden_layers"]
    return [((heads + 2 * kv_heads) * head_dim, hidden, layers), (hidden, heads * head_dim, layers),
            (2 * inter, hidden, layers), (hidden, inter, layers),
            (config["vocab_size"], hidden, 1)]


def kernel_step_s(threads: int, dtype: str, shapes: list[tuple[int, int, int]],
                  rows: int) -> tuple[float, str]:
    """Seconds of one decode step's GEMMs at `rows` rows through vLLM's CPU GEMM, every layer
    its own weights (streamed from memory, as in a step; best of 5 passes), and the kernel."""
    import torch

    torch.set_num_threads(threads)
    kind = getattr(torch, dtype)
    calls = []
    try:
        from vllm import _custom_ops as ops

        onednn = bool(ops._supports_onednn)
    except Exception:  # no vLLM here: torch's linear is the kernel
        onednn = False
    for out_f, in_f, count in shapes:
        x = torch.randn(rows, in_f).to(kind)
        for _ in range(count):
            w = torch.randn(out_f, in_f).to(kind)
            if onednn:
                handle = ops.create_onednn_mm(w.t(), 32)
                calls.append(lambda h=handle, x=x: ops.onednn_mm(h, x, None))
            else:
                calls.append(lambda w=w, x=x: torch.nn.functional.linear(x, w))

    def step() -> None:
        for call in calls:
            call()

    step()
    return _best(step), "vLLM's onednn_mm" if onednn else "torch linear"


def worker_threads() -> int:
    """The engine worker's OpenMP threads on this instance, as Podium chooses them at boot."""
    import os

    from podium.backends.vllm.worker_threads import choose, core_siblings, cores

    cpus = os.sched_getaffinity(0)
    chosen = choose("auto", os.environ, cpus)
    if chosen.threads is not None:
        return chosen.threads
    found = cores(cpus, core_siblings)  # vLLM's own binding: one core reserved past one
    return max(1, len(found) - 1)


def parse_loads(text: str) -> list[tuple[int, int]]:
    """`IN/OUT,IN/OUT` as (input, output) pairs."""
    loads = []
    for part in text.split(","):
        tokens_in, _, tokens_out = part.partition("/")
        loads.append((int(tokens_in), int(tokens_out)))
    return loads


def load_bound(model: dict[str, float], bw: float, prefill_tok_s: float, batch: int,
               tokens_in: int, tokens_out: int) -> dict[str, float]:
    """The decode bound and the load's bound (output tokens/s) of one load."""
    context = tokens_in + tokens_out / 2
    step_bytes = model["weight_bytes"] + batch * context * model["kv_bytes_per_token"]
    load_s = batch * tokens_in / prefill_tok_s + tokens_out * step_bytes / (bw * 1e9)
    return {"context": context, "step_bytes": step_bytes,
            "decode": batch / (step_bytes / (bw * 1e9)), "bound": batch * tokens_out / load_s}




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--achieved", default=None,
                        help="output tokens/s measured on the loads, one per load, comma-"
                             "separated")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads to measure with (default: the engine worker's)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--loads", default="128/64,32/256",
                        help="IN/OUT prompt and output tokens per request, comma-separated")
    parser.add_argument("--input", type=int, default=None, help="one load's IN (old form)")
    parser.add_argument("--output", type=int, default=None, help="one load's OUT (old form)")
    parser.add_argument("--no-kernel", action="store_true",
                        help="skip the engine GEMM kernel's decode step")
    args = parser.parse_args()
    from podium.package.defaults import default_model_dir

    loads = parse_loads(args.loads)
    if args.input is not None or args.output is not None:
        loads = [(args.input or 128, args.output or 64)]
    achieved = ([float(a) for a in args.achieved.split(",")] if args.achieved else [])
    if achieved and len(achieved) != len(loads):
        parser.error(f"--achieved has {len(achieved)} figure(s) for {len(loads)} load(s)")
    threads = args.threads or worker_threads()
    root = default_model_dir()
    model = model_figures(root)
    bw = bandwidth_gb_s(threads)
    dtype = "bfloat16" if model["dtype_bytes"] == 2 else "float32"
    print(f"model: {model['weight_bytes'] / 1e6:.0f} MB of {dtype} weights "
          f"({model['params'] / 1e6:.0f} M parameters), KV {model['kv_bytes_per_token']} B/token")
    whose = "" if args.threads else ", the engine worker's"
    print(f"machine ({threads} thread(s){whose}): copy {bw:.1f} GB/s")
    for i, (tokens_in, tokens_out) in enumerate(loads):
        # the prefill GEMM of this load's shape: batch x input rows
        prefill_flops = gemm_gflop_s(threads, dtype, m=args.batch * tokens_in) * 1e9
        prefill_tok_s = prefill_flops / (2 * model["params"])
        b = load_bound(model, bw, prefill_tok_s, args.batch, tokens_in, tokens_out)
        print(f"load {args.batch} x {tokens_in} in / {tokens_out} out: {dtype} GEMM "
              f"{prefill_flops / 1e9:.0f} GFLOP/s at M={args.batch * tokens_in}, prefill bound "
              f"{prefill_tok_s:.0f} prompt tok/s; decode bound "
              f"{b['decode']:.0f} tok/s ({b['step_bytes'] / 1e6:.0f} MB read per step, context "
              f"{b['context']:.0f}); output <= {b['bound']:.0f} tok/s")
        if achieved:
            print(f"  achieved {achieved[i]:.1f} tok/s = {achieved[i] / b['bound']:.2f} of the "
                  "bound")
    if not args.no_kernel:
        config = json.loads((root / "config.json").read_text())
        step_s, kernel = kernel_step_s(threads, dtype, linear_shapes(config), args.batch)
        print(f"beside it: the decode step's GEMMs alone ({kernel}, M={args.batch}, weights "
              f"streamed) {step_s * 1e3:.1f} ms = {args.batch / step_s:.0f} tok/s at most with "
              "that kernel")


if __name__ == "__main__":
    main()
