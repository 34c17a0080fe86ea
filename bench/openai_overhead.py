"""Podium vs vLLM's own OpenAI server on the same model and machine, in one run.

Measures, for each server in turn (never both at once: they would share 2 cores):
- boot to ready (Podium from the cache, Podium from a fresh package with materialization,
  and the reference `python -m vllm.entrypoints.openai.api_server`);
- output-token throughput and median TTFT under vLLM's own serving benchmark
  (`vllm.benchmarks.serve`, random dataset, 128 tokens in / 64 out, concurrency 16).

Both servers run at one dtype: by default the one Podium's `precision: auto` resolves to on
this machine (float32 on a CPU without bf16 instructions), given to vLLM as `--dtype`, so the
ratio is Podium's own overhead; `--precision bf16` compares at the checkpoint's bf16.
`--defaults` compares defaults with defaults instead: `make serve`'s package as it is against
`vllm.entrypoints.openai.api_server --model DIR` with nothing else (vLLM's compiled mode, the
checkpoint's dtype).

`--long-share 0.25` makes the load mixed: that share of the prompts is `--long-len` (2,000)
tokens long, the rest 128 (a custom dataset of unrelated random-token prompts, so no prefix is
shared), where chunked prefill decides how long a long prompt holds up the running decodes.

Usage: python -m bench.openai_overhead [--num-prompts 64] [--rounds 2]
       [--precision auto|bf16|fp16|fp32] [--defaults] [--long-share 0.25 [--long-len 2000]]
       [--skip-fresh]
Prints one JSON line per measurement and a table of ratios (Podium / reference).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.harness import ROOT, Served, abba, free_port, median, print_ratios, serve
from bench.harness.vllm_serving import serving_benchmark
from podium.package.precision import PRECISIONS

MODEL = "smollm2-135m-instruct"
ENGINE_ARGS = ["--enforce-eager", "--max-model-len", "8192"]  # the default package's args


def resolved_precision(model_dir: Path, precision: str = "auto") -> str:
    """`precision`, with auto replaced by what the default package's auto runs at here."""
    if precision != "auto":
        return precision
    from podium.package.precision import resolve_auto

    resolved = resolve_auto(model_dir)
    return resolved.precision.name if resolved.precision else "bf16"


@contextlib.contextmanager
def server(kind: str, model_dir: Path, port: int, env: dict[str, str], log: Path,
           precision: str = "auto", defaults: bool = False) -> Iterator[Served]:
    """One server for the block, both at `precision` (auto: the package's auto here, given to
    vLLM); with `defaults`, each with its own defaults instead. `boot_s` is start to ready."""
    precision = resolved_precision(model_dir, precision)
    if kind == "podium":
        from podium.package.defaults import default_llm_manifest
        from podium.package.package import write_manifest

        manifest = default_llm_manifest()
        if not defaults:
            manifest["precision"] = precision
        pkg = write_manifest(Path(env["PODIUM_HOME"]) / "packages" / f"{MODEL}-bench",
                             manifest).root
        cmd = [sys.executable, "-m", "podium.cli", "serve", str(pkg), "--host", "127.0.0.1",
               "--http-port", str(port), "--grpc-port", "-1"]
        ready = f"http://127.0.0.1:{port}/health/ready"
    else:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(model_dir), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port",
               str(port), "--disable-uvicorn-access-log"]
        if not defaults:
            cmd += [*ENGINE_ARGS, "--dtype", PRECISIONS[precision].dtype]
        ready = f"http://127.0.0.1:{port}/health"
    with serve(cmd, ready, timeout_s=900, log=log, env=env, stop_timeout_s=120) as served:
        yield served


def load(port: int, model_dir: Path, num_prompts: int, concurrency: int,
         dataset: Path | None = None) -> dict:
    """vLLM's serving benchmark against one server: random 128 in / 64 out, or the prompts of
    a custom `dataset` (64 out each)."""
    result = serving_benchmark(f"http://127.0.0.1:{port}", MODEL, model_dir, num_prompts,
                               concurrency, dataset=dataset)
    return {"output_throughput": result["output_throughput"],
            "median_ttft_ms": result["median_ttft_ms"], "p99_ttft_ms": result["p99_ttft_ms"],
            "median_itl_ms": result.get("median_itl_ms"), "completed": result["completed"]}


def mixed_dataset(path: Path, model_dir: Path, num_prompts: int, long_share: float,
                  long_len: int, short_len: int = 128) -> Path:
    """A JSONL of `num_prompts` prompts of random tokens (seeded), `long_share` of them
    `long_len` tokens long and spread evenly through the run, the others `short_len`."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rng = random.Random(0)
    special = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    num_long = round(num_prompts * long_share)
    every = num_prompts / num_long if num_long else 0
    long_at = {int(k * every) for k in range(num_long)}
    lines = []
    for i in range(num_prompts):
        n = long_len if i in long_at else short_len
        text = tok.decode(rng.choices(ids, k=n))
        lines.append(json.dumps({"prompt": text}))
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--defaults", action="store_true",
                        help="each server with its own defaults (no shared args or dtype)")
    parser.add_argument("--long-share", type=float, default=0.0,
                        help="share of long prompts (a mixed load; 0: random 128 in)")
    parser.add_argument("--long-len", type=int, default=2000)
    parser.add_argument("--skip-fresh", action="store_true",
                        help="skip the boot of a fresh package (materialization)")
    opts = parser.parse_args()

    from podium.package.cache import ModelCache
    from podium.package.defaults import write_default_package
    home = Path(os.environ.get("PODIUM_HOME", ROOT / ".podium"))
    env = {**os.environ, "PODIUM_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    os.environ.update(env)
    model_dir = ModelCache().materialize(write_default_package()).path
    precision = resolved_precision(model_dir, opts.precision)
    print("each server with its own defaults" if opts.defaults
          else f"both servers at {precision}", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="podium-bench-"))
    dataset = None
    if opts.long_share > 0:
        dataset = mixed_dataset(logs / "mixed.jsonl", model_dir, opts.num_prompts,
                                opts.long_share, opts.long_len)
        print(f"mixed load: {opts.long_share:.0%} of {opts.num_prompts} prompts "
              f"{opts.long_len} tokens long, the rest 128 ({dataset})", flush=True)
    results: dict[str, list[dict]] = {"podium": [], "reference": []}
    for round_no, kind in abba(opts.rounds, peer="reference", podium="podium"):
        port = free_port()
        with server(kind, model_dir, port, env, logs / f"{kind}-{round_no}.log", precision,
                    opts.defaults) as served:
            figures = {"boot_s": served.boot_s, **load(port, model_dir, opts.num_prompts,
                                                       opts.concurrency, dataset)}
        results[kind].append(figures)
        print(json.dumps({"server": kind, "round": round_no, **figures}), flush=True)

    fresh_boot = None
    if not opts.skip_fresh:
        fresh_home = Path(tempfile.mkdtemp(prefix="podium-fresh-"))
        with server("podium", model_dir, free_port(), {**env, "PODIUM_HOME": str(fresh_home)},
                    logs / "podium-fresh.log", precision, opts.defaults) as served:
            fresh_boot = served.boot_s
        shutil.rmtree(fresh_home, ignore_errors=True)
        print(json.dumps({"server": "podium-fresh-package", "boot_s": fresh_boot}), flush=True)

    def values(kind: str, key: str) -> list[float]:
        return [r[key] for r in results[kind]]

    rows = [
        ("output tok/s (higher is better)", "output_throughput"),
        ("median TTFT ms (lower is better)", "median_ttft_ms"),
        ("p99 TTFT ms (lower is better)", "p99_ttft_ms"),
        ("boot to ready s, from cache", "boot_s"),
    ]
    print("\neach with its own defaults" if opts.defaults
          else f"\nboth at {precision} ({PRECISIONS[precision].dtype})")
    print(f"ratios podium / reference per round, rounds alternated A/B/B/A ({opts.rounds})\n")
    print_ratios([(label, values("podium", key), values("reference", key))
                  for label, key in rows], peer="reference")
    ref_boot = median(values("reference", "boot_s"))
    if fresh_boot is not None:
        print(f"{'boot to ready s, fresh package':38} {fresh_boot:10.2f} {ref_boot:10.2f}  "
              f"x{fresh_boot / ref_boot:.3f}")
    print(f"logs: {logs}")


if __name__ == "__main__":
    main()
