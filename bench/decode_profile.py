"""Where a decode step's time goes: the default LLM decoding in one process, each part timed.

    python -m bench.decode_profile [--threads 2] [--batch 16] [--input 32] [--output 256]
                                   [--compiled] [--torch-profile 20]

Builds vLLM's `LLM` of the default model (the cache's bf16 folder, eager unless `--compiled`)
in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: engine core, scheduler and model runner
share the one interpreter, so no IPC and no spin wait between them), its OpenMP team bound to
CPUs 0..threads-1, and wraps, at class level, the engine core's step, the scheduler's
`schedule` / `update_from_output`, the model runner's `execute_model` (and within it
`_prepare_inputs`, `_model_forward`, the attention backend's `forward`, `compute_logits`) and
`sample_tokens` (within it the sampler and Podium's constraint logits processor, no row
constrained). It generates `--batch` random prompts of `--input` tokens, `--output` tokens each
(`ignore_eos`, temperature 1 as `vllm bench serve` sends), then prints, over the pure decode
steps (every sequence decoding one token), each part's mean milliseconds per step and share,
the decode tokens/s of this in-process loop, and (`--torch-profile N`) torch.profiler's
operator table for N decode steps.

What it leaves out is the served path's own cost: the API server, the engine core's process and
its shared-memory queue to the worker; compare its step time with the served ITL.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import time
from typing import Any

TIMES: dict[str, float] = collections.defaultdict(float)
STEPS: list[tuple[int, dict[str, float]]] = []


def _wrap(cls: type, name: str, label: str, on_return: Any = None) -> None:
    original = getattr(cls, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = original(*args, **kwargs)
        TIMES[label] += time.perf_counter() - started
        if on_return is not None:
            on_return(out)
        return out

    setattr(cls, name, timed)


def _instrument() -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from podium.constraints.processor import ConstraintLogitsProcessor

    scheduled: list[int] = []
    _wrap(Scheduler, "schedule", "scheduler.schedule",
          lambda out: scheduled.append(out.total_num_scheduled_tokens))
    _wrap(Scheduler, "update_from_output", "scheduler.update_from_output")
    _wrap(GPUModelRunner, "execute_model", "runner.execute_model")
    _wrap(GPUModelRunner, "_update_states", "runner.execute_model/_update_states")
    _wrap(GPUModelRunner, "_prepare_inputs", "runner.execute_model/_prepare_inputs")
    _wrap(GPUModelRunner, "_model_forward", "runner.execute_model/_model_forward")
    _wrap(CPUAttentionBackendImpl, "forward", "runner.execute_model/_model_forward/attention")
    _wrap(GPUModelRunner, "sample_tokens", "runner.sample_tokens")
    _wrap(Sampler, "forward", "runner.sample_tokens/sampler")
    _wrap(Sampler, "apply_logits_processors", "runner.sample_tokens/sampler/logits_processors")
    _wrap(ConstraintLogitsProcessor, "apply",
          "runner.sample_tokens/sampler/logits_processors/podium_constraints")
    _wrap(GPUModelRunner, "_bookkeeping_sync", "runner.sample_tokens/_bookkeeping_sync")

    original_step = EngineCore.step

    def step(self: Any) -> Any:
        TIMES.clear()
        started = time.perf_counter()
        out = original_step(self)
        TIMES["engine_core.step"] = time.perf_counter() - started
        if scheduled:
            STEPS.append((scheduled[-1], dict(TIMES)))
            scheduled.clear()
        return out

    EngineCore.step = step  # type: ignore[method-assign]
    _wrap_compute_logits()


def _wrap_compute_logits() -> None:
    from vllm.model_executor.models.llama import LlamaForCausalLM

    _wrap(LlamaForCausalLM, "compute_logits", "runner.execute_model/compute_logits")


def _report(batch: int, elapsed_decode: float | None) -> None:
    decode = [t for n, t in STEPS if n == batch]
    if not decode:
        print("no pure decode steps recorded")
        return
    decode = decode[len(decode) // 10:]  # drop the first tenth (warm-up of the decode phase)
    total = statistics.mean(t["engine_core.step"] for t in decode)
    print(f"decode steps: {len(decode)} (batch {batch}); engine_core.step "
          f"{total * 1e3:.2f} ms mean, median "
          f"{statistics.median(t['engine_core.step'] for t in decode) * 1e3:.2f} ms "
          f"-> {batch / total:.0f} tok/s in-process")
    labels = sorted({k for t in decode for k in t})
    for label in labels:
        mean = statistics.mean(t.get(label, 0.0) for t in decode)
        print(f"  {label:<70} {mean * 1e3:8.3f} ms  {mean / total:6.1%}")
    if elapsed_decode is not None:
        print(f"wall of generate: {elapsed_decode:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input", type=int, default=32)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--torch-profile", type=int, default=0, metavar="N")
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = (
        "0" if args.threads == 1 else f"0-{args.threads - 1}")
    import random

    from vllm import LLM, SamplingParams

    from podium.package.defaults import default_model_dir

    _instrument()
    llm = LLM(model=str(default_model_dir()), dtype="bfloat16", max_model_len=8192,
              enforce_eager=not args.compiled, seed=0)
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(100, vocab - 100) for _ in range(args.input)]}
               for _ in range(args.batch)]
    params = SamplingParams(max_tokens=args.output, ignore_eos=True, temperature=1.0,
                            top_p=args.top_p)
    llm.generate(prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    STEPS.clear()
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    print(f"generate: {args.batch} x {args.input} in / {args.output} out in {elapsed:.2f} s = "
          f"{args.batch * args.output / elapsed:.0f} output tok/s (in-process, {args.threads} "
          f"thread(s), {'compiled' if args.compiled else 'eager'})")
    _report(args.batch, None)
    if args.torch_profile:
        _torch_profile(llm, prompts, args)


def _torch_profile(llm: Any, prompts: list, args: argparse.Namespace) -> None:
    import torch
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=args.torch_profile + 2, ignore_eos=True,
                            temperature=1.0, top_p=args.top_p)
    llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    with (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
          contextlib.suppress(Exception)):
        llm.generate(prompts, params, use_tqdm=False)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
