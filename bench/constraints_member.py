"""Member-scale constraints: every request its own candidate set, per-step processor time.

256 requests in one batch, each with its own ``distinct_items`` spec (min 3, max 5) of 20-500
candidates drawn from a 50,000-title catalog, vocabulary 49,152 (SmolLM2's tokenizer).
Each spec is compiled as admission does (``ConstraintPrecompiler``: thread-pool compile into
the host's store) and the processor adopts the forms by key. Then, step by step and
interleaved, the bench times:

(b) ``per-request``: ``ConstraintLogitsProcessor`` over the batch of 256 distinct specs
    (``update_state`` before the "forward pass", ``apply`` after it, both timed);
(s) ``shared``: the same batch where every row has one spec (a 500-candidate one);
(c) ``floor``: one write pass over the logits (``fill_``), what any dense mask must do.

Every row is mid-generation (a prefix of a valid array) and grows by one valid token per step.
It also reports compile time per request (cold: titles never tokenized before; warm: the
catalog's titles in the tokenization memo, as on an instance that has served for a while) and
the time the processor takes to adopt a precompiled spec.

    HF_HUB_OFFLINE=1 python -m bench.constraints_member [--repeats 3]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import torch
from tests.support.catalog import make_titles

from bench.harness import percentiles
from podium.package.defaults import default_model_dir

BATCH, VOCAB, CATALOG = 256, 49_152, 50_000


def _spec(rng: random.Random, catalog: list[str], n: int) -> dict[str, Any]:
    from podium.constraints import validate_constraint

    return validate_constraint({"type": "distinct_items", "items": rng.sample(catalog, n),
                                "min": 3, "max": 5})


def _walk(tok: Any, spec: dict[str, Any], rng: random.Random) -> list[int]:
    """A valid output of ``spec`` with its most items, as tokens (segments encoded apart)."""
    chosen = rng.sample(spec["items"], spec["max"])
    parts = ["["] + [p for i, it in enumerate(chosen)
                     for p in ([", "] if i else []) + [json.dumps(it)]] + ["]"]
    return [t for seq in tok.encode_batch(parts) for t in seq]


def _percentiles(xs: list[float]) -> str:
    q = percentiles([x * 1e3 for x in xs])
    return f"p50 {q['p50']:.2f} ms, p90 {q['p90']:.2f} ms, p99 {q['p99']:.2f} ms (n={len(xs)})"


def _processor(model: str) -> Any:
    from podium.constraints.processor import ConstraintLogitsProcessor

    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=model,
                                                          get_vocab_size=lambda: VOCAB))
    return ConstraintLogitsProcessor(config, torch.device("cpu"), False)


def _params(spec: dict[str, Any], key: str) -> Any:
    from vllm import SamplingParams

    from podium.constraints import KEY_XARGS, to_vllm_xargs

    return SamplingParams(extra_args={**to_vllm_xargs(spec), KEY_XARGS: key})


def measure_steps(model: str, tok: Any, per_row: list[tuple[dict, str]],
                  shared: tuple[dict, str], rng: random.Random, steps: int) -> dict[str, list]:
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    procs = {"per-request": _processor(model), "shared": _processor(model)}
    rows = {"per-request": per_row, "shared": [shared] * BATCH}
    walks = {m: [_walk(tok, spec, rng) for spec, _ in rows[m]] for m in procs}
    span = min(len(w) for ws in walks.values() for w in ws) - 1
    steps = min(steps, span - 1)
    outs: dict[str, list[list[int]]] = {}
    adopt = 0.0
    for mode, proc in procs.items():
        start = [rng.randrange(0, len(w) - steps) for w in walks[mode]]
        outs[mode] = [w[:s] for w, s in zip(walks[mode], start, strict=True)]
        walks[mode] = [w[s: s + steps] for w, s in zip(walks[mode], start, strict=True)]
        added = [(i, _params(*rows[mode][i]), None, outs[mode][i]) for i in range(BATCH)]
        t0 = time.perf_counter()
        proc.update_state(BatchUpdate(BATCH, [], added, []))
        if mode == "per-request":
            adopt = time.perf_counter() - t0
        proc.apply(torch.zeros(BATCH, VOCAB))  # untimed: replays each row's prefix
        assert proc.engine_compiles == 0, "a spec was compiled in the engine step"
    src = torch.randn(BATCH, VOCAB)
    buf = torch.empty_like(src)
    times: dict[str, list[float]] = {"per-request": [], "shared": [], "floor": []}
    for step in range(steps):
        for mode, proc in procs.items():
            for i in range(BATCH):
                outs[mode][i].append(walks[mode][i][step])
            t0 = time.perf_counter()
            proc.update_state(None)  # before the forward pass
            prepare = time.perf_counter() - t0
            buf.copy_(src)  # the model writes the logits
            t0 = time.perf_counter()
            proc.apply(buf)
            times[mode].append(prepare + time.perf_counter() - t0)
            finite = torch.isfinite(buf).sum(dim=1)
            assert bool((finite > 0).all()), "a row had no allowed token"
        buf.copy_(src)
        t0 = time.perf_counter()
        buf.fill_(float("-inf"))
        times["floor"].append(time.perf_counter() - t0)
    times["adopt"] = [adopt]
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("PODIUM_TEST_MODEL_DIR"))
    ap.add_argument("--steps", type=int, default=25, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    args.model = args.model or str(default_model_dir())
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # a fresh directory where the host's cache lives by default (/dev/shm: in memory), so a
    # compile's publish costs what it costs in a server, not a write to disk
    from podium.env import constraint_cache_dir

    if "PODIUM_CONSTRAINT_CACHE" not in os.environ:
        own = tempfile.mkdtemp(prefix="podium-bench-", dir=constraint_cache_dir().parent)
        os.environ["PODIUM_CONSTRAINT_CACHE"] = own
        atexit.register(shutil.rmtree, own, ignore_errors=True)
    from podium.constraints import ConstraintPrecompiler

    rng = random.Random(0)
    catalog = make_titles(CATALOG)
    compiler = ConstraintPrecompiler(args.model, VOCAB)
    compiler.compile_now(_spec(rng, catalog, 3))  # loads the tokenizer (once per process)
    tok = compiler.load_tokenizer()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} "
          f"CPUs, load average {os.getloadavg()[0]:.1f}")

    def compile_all(sizes: list[int]) -> tuple[list[tuple[dict, str]], list[float]]:
        out, secs = [], []
        for n in sizes:
            spec = _spec(rng, catalog, n)
            r = compiler.compile_now(spec)
            assert r.key is not None and not r.cached
            out.append((spec, r.key))
            secs.append(r.seconds)
        return out, secs

    sizes = [rng.randint(20, 500) for _ in range(BATCH)]
    per_row, cold = compile_all(sizes)
    print(f"compile, cold memo, 256 specs of 20-500: {_percentiles(cold)}")
    tok.encode_runs(catalog, quoted=True)  # the catalog in the memo, as distinct_items spells it
    _, warm = compile_all(sizes)
    print(f"compile, warm memo, 256 specs of 20-500: {_percentiles(warm)}")
    _, warm500 = compile_all([500] * 300)  # 300: the p99 is not the second largest of 100
    print(f"compile, warm memo, 300 specs of 500:    {_percentiles(warm500)}")
    shared = compile_all([500])[0][0]
    keys = {k for _, k in per_row}
    assert len(keys) == BATCH
    print(f"\nper step, batch {BATCH}, vocab {VOCAB:,}: median µs over {args.steps} steps")
    print(f"{'repeat':<8}{'(b) per-request':>16}{'(s) shared':>12}{'(c) floor':>11}"
          f"{'b/c':>7}{'b/s':>7}{'adopt µs/req':>14}")
    ratios = []
    for rep in range(args.repeats):
        t = measure_steps(args.model, tok, per_row, shared, rng, args.steps)
        b, s, c = (statistics.median(t[m]) * 1e6 for m in ("per-request", "shared", "floor"))
        ratios.append((b / c, b / s))
        print(f"{rep + 1:<8}{b:>16.0f}{s:>12.0f}{c:>11.0f}{b / c:>7.2f}{b / s:>7.2f}"
              f"{t['adopt'][0] / BATCH * 1e6:>14.1f}", flush=True)
    bc, bs = zip(*ratios, strict=True)
    print(f"b/c {min(bc):.2f}-{max(bc):.2f} (median {statistics.median(bc):.2f}); "
          f"b/s {min(bs):.2f}-{max(bs):.2f} (median {statistics.median(bs):.2f})")


if __name__ == "__main__":
    main()
