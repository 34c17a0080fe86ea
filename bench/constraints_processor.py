"""Per-step logits-processor time: per-request Python vs Podium's batch processor vs the floor.

For each constraint (``choice`` of 10,000 titles, ``distinct_items`` over 5,000 candidates),
batch size and vocabulary width, one run measures:

(a) ``per_request``: an honest per-row processor (what vLLM's ``AdapterLogitsProcessor``
    runs): each request advances its own state with a dict lookup and masks its own row
    with a cached tensor of allowed tokens; ``distinct_items`` calls the same compiled
    constraint one row at a time;
(b) ``batch``: ``ConstraintLogitsProcessor`` on the whole batch, both halves timed: its
    ``update_state`` (state sync + allowed tokens, which vLLM runs before the forward pass)
    and its ``apply`` (the mask); the bench writes the logits in between, as the model does;
(c) ``floor``: one pass writing the batch's logits tensor (``fill_``), which any dense mask
    must at least do.

``b sync`` is the ``update_state`` part of (b): everything but the mask itself.

Every row is mid-generation: its history is a prefix of a valid output and grows by one valid
token per step, exactly as in decoding. Times are medians over the timed steps.

    HF_HUB_OFFLINE=1 python -m bench.constraints_processor [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from tests.support.catalog import make_titles

from podium.package.defaults import default_model_dir

BATCHES = (1, 8, 32, 128, 256)
VOCABS = (49_152, 128_256)
EOS = float("-inf")


def _walks(kind: str, tok: Any, spec: dict[str, Any], rng: random.Random, n: int) -> list:
    """``n`` valid token sequences for the constraint (each a full output)."""
    if kind == "choice":
        titles = rng.sample(spec["choices"], n)
        return tok.encode_batch(titles)
    out = []
    for _ in range(n):
        chosen = rng.sample(spec["items"], spec["max"])
        parts = ["["] + [p for i, it in enumerate(chosen)
                         for p in ([", "] if i else []) + [json.dumps(it)]] + ["]"]
        out.append([t for seq in tok.encode_batch(parts) for t in seq])
    return out


class PerRequest:
    """Baseline (a): one Python object per request, called once per row per step."""

    def __init__(self, constraint: Any, eos: tuple[int, ...], handle: int) -> None:
        from podium.constraints import TableConstraint

        self.c, self.eos = constraint, torch.tensor(eos)
        self.table = constraint.table if isinstance(constraint, TableConstraint) else None
        self.h = np.array([handle])
        self.state = int(constraint.start(self.h)[0])
        self.consumed = 0

    def __call__(self, out: list[int], row: torch.Tensor,
                 cache: dict[int, torch.Tensor], moves: dict[int, dict[int, int]]) -> None:
        while self.consumed < len(out):
            tok = out[self.consumed]
            if self.table is not None:
                m = moves.get(self.state)
                if m is None:
                    lo, hi = self.table.offsets[self.state], self.table.offsets[self.state + 1]
                    m = moves[self.state] = dict(zip(self.table.tokens[lo:hi].tolist(),
                                                     self.table.targets[lo:hi].tolist(),
                                                     strict=True))
                self.state = m.get(tok, -1)
            else:
                self.state = int(self.c.advance(self.h, np.array([self.state]),
                                                np.array([tok]))[0])
            self.consumed += 1
        allowed = cache.get(self.state) if self.table is not None else None
        if allowed is None:
            _, toks = self.c.allowed(self.h, np.array([self.state]))
            acc = self.c.is_accepting(self.h, np.array([self.state]))[0]
            allowed = torch.from_numpy(toks)
            if acc or len(toks) == 0:
                allowed = torch.cat([allowed, self.eos])
            if self.table is not None:
                cache[self.state] = allowed
        kept = row[allowed]
        row.fill_(EOS)
        row[allowed] = kept


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def bench_one(kind: str, spec: dict[str, Any], model: str, tok: Any, batch: int, vocab: int,
              rng: random.Random, steps: int) -> dict[str, float]:
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate

    from podium.constraints import to_vllm_xargs
    from podium.constraints.processor import ConstraintLogitsProcessor

    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=model,
                                                          get_vocab_size=lambda: vocab))
    proc = ConstraintLogitsProcessor(config, torch.device("cpu"), False)
    params = SamplingParams(extra_args=to_vllm_xargs(spec))
    src = torch.randn(batch, vocab)
    buf = torch.empty_like(src)
    times: dict[str, list[float]] = {"per_request": [], "batch": [], "sync": [], "floor": []}
    cache: dict[int, torch.Tensor] = {}
    moves: dict[int, dict[int, int]] = {}
    while len(times["batch"]) < steps:
        walks = _walks(kind, tok, spec, rng, batch)
        span = min(len(w) for w in walks) - 1
        offsets = [rng.randrange(0, len(w) - span) for w in walks]
        outs = [w[:o] for w, o in zip(walks, offsets, strict=True)]
        proc.update_state(BatchUpdate(batch, [], [(i, params, None, outs[i])
                                                  for i in range(batch)], []))
        buf.copy_(src)
        proc.apply(buf)  # untimed: replays each row's starting prefix
        constraint = proc._compiler.compile(to_vllm_xargs(spec)["podium_constraint"])
        rows = [PerRequest(constraint, tok.eos_token_ids, 10_000 + i) for i in range(batch)]
        base_outs = [list(o) for o in outs]
        buf.copy_(src)
        for i, r in enumerate(rows):
            r(base_outs[i], buf[i], cache, moves)
        for step in range(span):
            for i in range(batch):
                nxt = walks[i][offsets[i] + step]
                outs[i].append(nxt)
                base_outs[i].append(nxt)
            # engine order: update_state (tokens of the last step) -> forward pass -> apply
            t0 = time.perf_counter()
            proc.update_state(None)
            prepare = time.perf_counter() - t0
            buf.copy_(src)
            t0 = time.perf_counter()
            proc.apply(buf)
            times["batch"].append(prepare + time.perf_counter() - t0)
            times["sync"].append(prepare)
            buf.copy_(src)
            t0 = time.perf_counter()
            for i, r in enumerate(rows):
                r(base_outs[i], buf[i], cache, moves)
            times["per_request"].append(time.perf_counter() - t0)
            buf.copy_(src)  # same starting point as the others: a freshly written tensor
            t0 = time.perf_counter()
            buf.fill_(EOS)
            times["floor"].append(time.perf_counter() - t0)
        proc.update_state(BatchUpdate(0, list(range(batch)), [], []))
    return {k: _median_us(v) for k, v in times.items()}



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("PODIUM_TEST_MODEL_DIR"),
                    help="HF folder of the model (default: the default model, from the cache)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per configuration")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: the figures do not depend on idle cores)")
    args = ap.parse_args()
    args.model = args.model or str(default_model_dir())
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from podium.constraints import TokenizerInfo, validate_constraint

    tok = TokenizerInfo.from_pretrained(args.model)
    specs = {
        "choice": validate_constraint({"type": "choice", "choices": make_titles(10_000)}),
        "distinct_items": validate_constraint({"type": "distinct_items",
                                               "items": make_titles(5_000), "min": 1,
                                               "max": 5}),
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs; median µs per step over {args.steps} steps")
    header = (f"{'constraint':<15}{'vocab':>8}{'batch':>6}{'(a) per-req':>13}{'(b) batch':>11}"
              f"{'(c) floor':>11}{'b/c':>7}{'a/b':>7}{'b µs/req':>10}{'b sync':>8}")
    print(header)
    rng = random.Random(0)
    for kind, spec in specs.items():
        for vocab in VOCABS:
            per_req_at_1 = None
            for batch in map(int, args.batches.split(",")):
                r = bench_one(kind, spec, args.model, tok, batch, vocab, rng, args.steps)
                per_req = r["batch"] / batch
                per_req_at_1 = per_req_at_1 or per_req
                print(f"{kind:<15}{vocab:>8}{batch:>6}{r['per_request']:>13.0f}"
                      f"{r['batch']:>11.0f}{r['floor']:>11.0f}{r['batch'] / r['floor']:>7.2f}"
                      f"{r['per_request'] / r['batch']:>7.2f}{per_req:>10.1f}{r['sync']:>8.0f}"
                      f"   (per-req µs vs batch 1: {per_req / per_req_at_1:.3f})", flush=True)


if __name__ == "__main__":
    main()
