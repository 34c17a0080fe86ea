"""Speculative decoding's draft rows through the constraint processor, host side, on CPU.

The H200 run of ``bench/gpu_v2_check.py`` timed ``apply`` at batch 256 (vocab 49,152, 256
distinct ``distinct_items`` specs of 20-500 candidates) at 1.00 ms with no drafts and 10.9 ms
with 3 drafts per request (1,024 rows), with ~8 small launches and 2 syncs on the device: the
rest is host work. This bench replays that batch through Model Runner V2's interface
(``RequestState`` with host buffers, as vLLM's CPU worker builds it, and a ``LogitsContext``
per step) with the logits on torch's ``meta`` device, so the mask's device work (index copies,
fill) costs nothing, as asynchronous launches on a GPU, and what is timed is the host's part.

Modes, interleaved step by step, repeated:
- ``plain``: 256 rows, no drafts;
- ``drafts``: 3 drafts per request (1,024 rows), by the current ``ConstraintBatch.peek``;
- ``drafts-rowwise``: the same, by the per-row Python scratch copy ``peek`` had before
  (``_rowwise_peek`` below, kept here as the "before").
``--drafts random`` draws drafts as the H200 bench did (random tokens: most kill the scratch
state at once); ``--drafts valid`` feeds each request's next 3 valid tokens (a perfect
drafter: every draft row is stepped through items).

    HF_HUB_OFFLINE=1 python -m bench.constraints_drafts [--steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from tests.support.catalog import make_titles

from podium.package.defaults import default_model_dir

BATCH, VOCAB, PROMPT, DRAFTS = 256, 49_152, 32, 3


def _rowwise_peek(self: Any, parents: np.ndarray, drafts: np.ndarray, depth: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``ConstraintBatch.peek`` as it was before (commit 73e55e2): scratch slots filled and
    emptied by a Python loop over the draft rows (typed-list reads and writes per row)."""
    from podium.constraints.compile.table import DEAD
    from podium.constraints.engine.batch import _NO_ALIVE, EMPTY, PYTHON

    parents = np.ascontiguousarray(parents, dtype=np.int64)
    n = len(parents)
    python = self.form[parents] == PYTHON
    base = int(self.active_slots()[-1]) + 1
    if base + n > len(self.form):
        self._grow(base + n)
    scratch = np.arange(base, base + n, dtype=np.int64)
    try:
        for a in self._slot_arrays():
            a[scratch] = a[parents]
        self.form[scratch[python]] = EMPTY
        for i, parent in enumerate(parents.tolist()):
            alive = self._alive[parent]
            self._alive[base + i] = alive.copy() if len(alive) else _NO_ALIVE
        compiled = np.flatnonzero(~python)
        for k in range(int(depth.max(initial=0))):
            at = compiled[depth[compiled] > k]
            if len(at):
                self._advance(scratch[at], drafts[at, k])
        rows, tokens = self._compiled_allowed(scratch[compiled])
        rows = compiled[rows]
        ended = np.flatnonzero(python)
        return (np.concatenate([rows, np.repeat(ended, len(self.eos))]),
                np.concatenate([tokens, np.tile(self.eos, len(ended))]))
    finally:
        self.form[scratch] = self.handle[scratch] = self.last_token[scratch] = EMPTY
        self.state[scratch] = DEAD
        self.consumed[scratch] = self.count[scratch] = 0
        for i in range(n):
            self._alive[base + i] = _NO_ALIVE
        self._active = None


def _walk(tok: Any, spec: dict[str, Any], rng: random.Random) -> list[int]:
    """A valid output of ``spec`` with its most items, as tokens (segments encoded apart)."""
    import json

    chosen = rng.sample(spec["items"], spec["max"])
    parts = ["["] + [p for i, it in enumerate(chosen)
                     for p in ([", "] if i else []) + [json.dumps(it)]] + ["]"]
    return [t for seq in tok.encode_batch(parts) for t in seq]


class Batch:
    """256 constrained requests in a V2 ``RequestState``, each mid-answer."""

    def __init__(self, model: str, tok: Any, precompiler: Any, rng: random.Random) -> None:
        import vllm.v1.worker.cpu.buffer_utils as cpu_buffers
        import vllm.v1.worker.gpu.buffer_utils as gpu_buffers
        from vllm import SamplingParams
        from vllm.v1.worker.gpu.states import RequestState

        from podium.constraints import KEY_XARGS, to_vllm_xargs, validate_constraint
        from podium.constraints.engine.processor import ConstraintLogitsProcessor

        gpu_buffers.UvaBuffer = cpu_buffers.UvaBuffer  # vLLM's CPU worker's swap
        self.rs = RequestState(BATCH + 8, 1024, 64, DRAFTS, VOCAB, torch.device("cpu"))
        config = SimpleNamespace(model_config=SimpleNamespace(
            tokenizer=model, get_vocab_size=lambda: VOCAB))
        self.proc = ConstraintLogitsProcessor(config, self.rs)
        titles = make_titles(5000)
        self.out: list[list[int]] = []
        self.next: list[list[int]] = []  # each request's valid continuation
        hist = self.rs.all_token_ids.gpu
        for slot in range(BATCH):
            spec = validate_constraint({
                "type": "distinct_items", "min": 1, "max": 3,
                "items": rng.sample(titles, 20 + (480 * slot) // (BATCH - 1))})
            key = precompiler.compile_now(spec).key
            walk = _walk(tok, spec, rng)
            cut = rng.randrange(0, len(walk) - DRAFTS)
            self.out.append(walk[:cut])
            self.next.append(walk[cut: cut + DRAFTS])
            self.rs.prompt_len.np[slot] = PROMPT
            hist[slot, :PROMPT] = torch.arange(100, 100 + PROMPT)
            if cut:
                hist[slot, PROMPT:PROMPT + cut] = torch.tensor(walk[:cut])
            params = SamplingParams(extra_args={**to_vllm_xargs(spec), KEY_XARGS: key})
            assert self.proc.add_request(slot, params)
        assert self.proc.engine_compiles == 0

    def ctx(self, drafts: list[list[int]], order: list[int]) -> tuple[Any, int]:
        from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

        slot_of, local, fed, pos = [], [], [], []
        for s in order:
            committed = PROMPT + len(self.out[s])
            last = self.out[s][-1] if self.out[s] else 100 + PROMPT - 1
            for j, t in enumerate([last, *drafts[s]]):
                slot_of.append(s)
                local.append(j)
                fed.append(t)
                pos.append(committed - 1 + j)
        idx = torch.tensor(order, dtype=torch.int32)
        return LogitsContext(
            expanded_idx_mapping=torch.tensor(slot_of, dtype=torch.int32),
            idx_mapping=idx, idx_mapping_np=idx.numpy(),
            expanded_local_pos=torch.tensor(local, dtype=torch.int32),
            input_ids=torch.tensor(fed, dtype=torch.int32),
            pos=torch.tensor(pos, dtype=torch.int64),
            seq_lens_upper_bound_np=np.array(
                [PROMPT + len(self.out[s]) + len(drafts[s]) for s in order], dtype=np.int32),
        ), len(slot_of)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("PODIUM_TEST_MODEL_DIR"))
    ap.add_argument("--steps", type=int, default=30, help="timed steps per mode per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drafts", choices=("random", "valid"), default="random")
    ap.add_argument("--profile", choices=("drafts", "drafts-rowwise"), default=None,
                    help="cProfile that mode's steps instead of timing")
    args = ap.parse_args()
    args.model = args.model or str(default_model_dir())
    torch.set_num_threads(1)
    from podium.env import constraint_cache_dir

    if "PODIUM_CONSTRAINT_CACHE" not in os.environ:
        own = tempfile.mkdtemp(prefix="podium-bench-", dir=constraint_cache_dir().parent)
        os.environ["PODIUM_CONSTRAINT_CACHE"] = own
        atexit.register(shutil.rmtree, own, ignore_errors=True)
    from podium.constraints import ConstraintPrecompiler
    from podium.constraints.engine.batch import ConstraintBatch

    rng = random.Random(0)
    precompiler = ConstraintPrecompiler(args.model, VOCAB)
    tok = precompiler.load_tokenizer()[0]
    b = Batch(args.model, tok, precompiler, rng)
    peeks = {"drafts": ConstraintBatch.peek, "drafts-rowwise": _rowwise_peek}
    none: list[list[int]] = [[] for _ in range(BATCH)]

    def step(mode: str) -> float:
        if mode == "plain":
            drafts = none
        elif args.drafts == "valid":
            drafts = b.next
        else:
            drafts = [[rng.randrange(3, 3000) for _ in range(DRAFTS)] for _ in range(BATCH)]
        order = list(range(BATCH))
        rng.shuffle(order)
        ctx, rows = b.ctx(drafts, order)
        logits = torch.empty(rows, VOCAB, device="meta")
        ConstraintBatch.peek = peeks.get(mode, ConstraintBatch.peek)  # type: ignore[method-assign]
        t0 = time.perf_counter()
        b.proc.apply(logits, ctx)
        return time.perf_counter() - t0

    modes = ["plain", "drafts", "drafts-rowwise"]
    for m in modes:  # untimed: numba's typed-list paths, the first replay
        step(m)
        step(m)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step(args.profile)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats("podium|numpy|torch", 25)
        return
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; batch {BATCH}, vocab {VOCAB:,}, {DRAFTS} {args.drafts} "
          f"drafts; apply per step, ms (logits on torch's meta device: host work only)")
    print(f"{'repeat':<8}" + "".join(f"{m + ' p50 (p10-p90)':>32}" for m in modes)
          + f"{'drafts/plain':>14}{'rowwise/plain':>15}")
    for rep in range(args.repeats):
        times: dict[str, list[float]] = {m: [] for m in modes}
        for i in range(args.steps):
            for m in modes[i % 3:] + modes[:i % 3]:  # rotate the order every step
                times[m].append(step(m) * 1e3)
        cells, med = [], {}
        for m in modes:
            q = statistics.quantiles(times[m], n=10)
            med[m] = statistics.median(times[m])
            cells.append(f"{med[m]:.2f} ({q[0]:.2f}-{q[-1]:.2f})")
        print(f"{rep + 1:<8}" + "".join(f"{c:>32}" for c in cells)
              + f"{med['drafts'] / med['plain']:>14.2f}"
              + f"{med['drafts-rowwise'] / med['plain']:>15.2f}", flush=True)


if __name__ == "__main__":
    main()
