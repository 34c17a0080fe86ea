"""Podium's constraint processor under vLLM 0.32's Model Runner V2 pieces, on a real GPU.

No vLLM CUDA build travels to the device machine (hundreds of MB of compiled kernels), so this
is NOT the engine: no model, no scheduler, no attention. It is the part of the V2 runner that
touches a logits processor, driven step by step with vLLM's own Python and Triton code:

- ``RequestState`` (``all_token_ids`` in pinned host memory seen by the GPU through UVA, as the
  runner's default; ``prompt_len`` / ``prefill_len`` UVA mirrors; ``total_len`` and
  ``num_computed_tokens`` on the device) and its staged writes (Triton ``_apply_write_kernel``);
- the processor built by V2's own loader from the installed ``vllm.logits_processors`` entry
  point, ``cls(vllm_config, LogitsProcRequestState)``, ``add_request`` per slot and
  ``apply_staged_writes`` as ``Sampler.add_request`` / ``apply_staged_writes`` call them;
- ``prepare_inputs``' kernels (``expand_idx_mapping``, ``prepare_prefill_inputs``,
  ``prepare_pos_seq_lens``, ``combine_sampled_and_draft_tokens``), the ``LogitsContext`` built
  as ``Sampler.apply_sampling_params`` builds it, then ``get_num_sampled_and_rejected`` and
  ``post_update``, which write each step's accepted tokens into ``all_token_ids`` and move
  ``total_len`` / ``num_computed_tokens`` / ``last_sampled_tokens`` on the device.

The model's logits are random; the scheduler (chunked prefill, preemption then re-prefill in
another slot, slot recycling, rows shuffled every step, 0-3 draft tokens per request) and the
rejection sampler's accept-then-bonus rule are played on the host. After every step each
constrained row's finite logits must equal a from-scratch replay of that request's history
(plus the row's drafts); unconstrained rows must be untouched; and the device's
``all_token_ids`` / ``total_len`` / ``num_computed_tokens`` must match the host's truth.

Part 2 times ``apply`` at batch 256 (256 distinct ``distinct_items`` specs of 20-500
candidates, vocab 49,152), decoding on the device (Gumbel argmax, ``post_update``), and counts
the host <-> device synchronizations inside ``apply`` (``torch.cuda.set_sync_debug_mode``) and
its copies (``torch.profiler``).

On the device (see docs/constraints.md, "Model Runner V2 on an NVIDIA GPU"):
    python3 .gpu/wt/bench/gpu_v2_check.py --out $OUT
Dry run here (CPU, vLLM's Triton kernels in Triton's interpreter, a small batch):
    python -m bench.gpu_v2_check --cpu --out /tmp/gpuv2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

VOCAB = 49_152
UVA_VIEWS: dict[str, int] = {}  # how the UVA views were made (see _cuda_view_op)


# --- running vLLM's V2 code without its compiled extensions ---

def _cpu_triton() -> None:
    """Dry run: vLLM's Triton kernels in Triton's interpreter on CPU tensors. vLLM's CPU build
    disables Triton unless a "cpu" backend is present; the interpreter needs none."""
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.backends import backends

    backends.setdefault("cpu", SimpleNamespace(driver=SimpleNamespace(is_active=lambda: True)))


def _cuda_view_op() -> None:
    """vLLM's one compiled op on this path, ``_C::get_cuda_view_from_cpu_tensor`` (csrc
    cuda_view.cu: ``cudaHostGetDevicePointer`` on a pinned tensor, wrapped as a CUDA tensor
    without a copy), written in Python. The CUDA build's ``vllm._C`` cannot travel; everything
    else on the processor's path is vLLM's Python and Triton."""
    import torch

    try:
        torch.ops._C.get_cuda_view_from_cpu_tensor  # noqa: B018
        return  # a real vLLM CUDA build is present
    except (AttributeError, RuntimeError):
        pass

    def device_pointer(cpu: torch.Tensor) -> int:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart  # cuda-python < 12.8
        err, ptr = cudart.cudaHostGetDevicePointer(cpu.data_ptr(), 0)
        assert err == cudart.cudaError_t.cudaSuccess, err
        return int(ptr)

    def view(cpu: torch.Tensor) -> torch.Tensor:
        assert cpu.is_pinned(), "UVA views need pinned memory"
        size = cpu.element_size()
        holder = SimpleNamespace(cpu=cpu, __cuda_array_interface__={
            "shape": tuple(cpu.shape), "typestr": cpu.numpy().dtype.str,
            "data": (device_pointer(cpu), False), "version": 3,
            "strides": tuple(s * size for s in cpu.stride())})
        try:
            out = torch.as_tensor(holder, device="cuda")
            UVA_VIEWS["as_tensor"] = UVA_VIEWS.get("as_tensor", 0) + 1
        except (RuntimeError, TypeError, ValueError) as e:  # through DLPack, no pointer check
            import cupy

            UVA_VIEWS[f"cupy (as_tensor: {str(e)[:80]})"] = 1
            mem = cupy.cuda.UnownedMemory(holder.__cuda_array_interface__["data"][0],
                                          cpu.numel() * size, holder, 0)
            arr = cupy.ndarray(tuple(cpu.shape), dtype=cpu.numpy().dtype,
                               memptr=cupy.cuda.MemoryPointer(mem, 0),
                               strides=holder.__cuda_array_interface__["strides"])
            out = torch.from_dlpack(arr)
        assert out.data_ptr() == holder.__cuda_array_interface__["data"][0]  # no copy
        return out

    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("get_cuda_view_from_cpu_tensor(Tensor cpu_tensor) -> Tensor")
    lib.impl("get_cuda_view_from_cpu_tensor", view, "CPU")
    _cuda_view_op.lib = lib  # type: ignore[attr-defined]  # keep the registration alive


def _setup(cpu: bool) -> Any:
    import torch

    if cpu:
        _cpu_triton()
        import vllm.v1.worker.cpu.buffer_utils as cpu_buffers
        import vllm.v1.worker.gpu.buffer_utils as gpu_buffers

        # the swap vLLM's CPU worker makes (vllm.v1.worker.cpu.shm): no pinned memory here
        gpu_buffers.UvaBuffer = cpu_buffers.UvaBuffer
        return torch.device("cpu")
    _cuda_view_op()
    from vllm.platforms import current_platform

    assert current_platform.is_cuda(), current_platform
    return torch.device("cuda")


# --- the reference: a from-scratch replay per row ---

class Oracle:
    def __init__(self, tok: Any) -> None:
        from podium.constraints.compile.compiler import ConstraintCompiler

        self.compiler = ConstraintCompiler(tok)
        self.eos = tok.eos_token_ids
        self._compiled: dict[str, Any] = {}

    def allowed(self, spec: dict[str, Any], history: list[int]) -> set[int]:
        from tests.support.walk import Walker

        from podium.constraints.spec.admission import validate_constraint

        key = json.dumps(spec, sort_keys=True)
        if key not in self._compiled:
            self._compiled[key] = self.compiler.compile(validate_constraint(spec))
        w = Walker(self._compiled[key], self.eos)  # a fresh batch: nothing carried over
        w.history = list(history)
        return w.allowed()


@dataclass
class Req:
    rid: str
    spec: dict[str, Any] | None
    prompt: list[int]
    params: Any
    out: list[int] = field(default_factory=list)
    computed: int = 0  # the scheduler's num_computed_tokens
    prefill_len: int = 0  # tokens fed at the latest (re)fill
    slot: int = -1
    done: bool = False

    @property
    def total(self) -> int:
        return len(self.prompt) + len(self.out)


class Runner:
    """The V2 model runner's request bookkeeping and input preparation, minus the model."""

    def __init__(self, config: Any, device: Any, max_reqs: int, max_len: int,
                 max_tokens: int, num_spec: int) -> None:
        import torch
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.gpu.sample.logits_processor.loader import (
            build_custom_logits_processors,
        )
        from vllm.v1.worker.gpu.states import RequestState

        from podium.constraints.engine.processor import ConstraintLogitsProcessor

        self.torch, self.device, self.num_spec = torch, device, num_spec
        self.rs = RequestState(max_reqs, max_len, max_tokens, num_spec, VOCAB, device)
        self.procs = build_custom_logits_processors(config, self.rs, False)
        [self.proc] = [p for p in self.procs if isinstance(p, ConstraintLogitsProcessor)]
        self.bufs = InputBuffers(max_reqs, max_tokens, device)

    def add(self, req: Req) -> None:
        """``add_requests``: the slot from the free list, tokens staged, processors told."""
        tokens = req.prompt + req.out  # a resumed request re-feeds its output
        req.prefill_len, req.computed = len(tokens), 0
        self.rs.add_request(req.rid, len(req.prompt), tokens, 0, 10**6)
        req.slot = self.rs.req_id_to_index[req.rid]
        for p in self.procs:
            p.add_request(req.slot, req.params)

    def flush(self, added: bool) -> None:
        if added:
            self.rs.apply_staged_writes()
        for p in self.procs:
            p.apply_staged_writes()

    def prepare(self, batch: list[tuple[Req, int, list[int]]]) -> dict[str, Any]:
        """``update_requests`` + ``prepare_inputs`` for (request, scheduled tokens, drafts)."""
        import numpy as np
        from vllm.utils.torch_utils import async_tensor_h2d
        from vllm.v1.worker.gpu.input_batch import (
            combine_sampled_and_draft_tokens,
            expand_idx_mapping,
            prepare_pos_seq_lens,
            prepare_prefill_inputs,
        )

        torch, rs, dev = self.torch, self.rs, self.device
        for req, _n, _d in batch:
            rs.num_computed_tokens_np[req.slot] = req.computed
        np.minimum(rs.num_computed_tokens_np, rs.prefill_len.np,
                   out=rs.num_computed_prefill_tokens)
        n = len(batch)
        idx_np = np.array([r.slot for r, _, _ in batch], dtype=np.intp)
        sched = np.array([k for _, k, _ in batch], dtype=np.int32)
        idx = async_tensor_h2d(idx_np, device=dev, dtype=torch.int64)
        num_drafts = np.array([len(d) for _, _, d in batch], dtype=np.int32)
        if not num_drafts.any():
            total_logits = n
            cu = torch.arange(n + 1, device=dev, dtype=torch.int32)
            expanded, local = idx, torch.zeros(n, dtype=torch.int32, device=dev)
        else:
            for req, _k, drafts in batch:  # the drafter's output, on the device
                if drafts:
                    rs.draft_tokens[req.slot, :len(drafts)] = torch.tensor(drafts, device=dev)
            total_logits = int(n + num_drafts.sum())
            cu_np = np.zeros(n + 1, dtype=np.int32)
            np.cumsum(num_drafts + 1, out=cu_np[1:])
            cu = async_tensor_h2d(cu_np, device=dev)
        qsl_np = np.empty(rs.max_num_reqs + 1, dtype=np.int32)
        qsl_np[0] = 0
        np.cumsum(sched, out=qsl_np[1:n + 1])
        qsl_np[n + 1:] = int(sched.sum())
        async_tensor_h2d(qsl_np, out=self.bufs.query_start_loc)
        if num_drafts.any():
            expanded, local = expand_idx_mapping(idx, total_logits, cu, self.num_spec + 1)
        qsl = self.bufs.query_start_loc[:n + 1]
        if (rs.num_computed_prefill_tokens[idx_np] < rs.prefill_len.np[idx_np]).any():
            prepare_prefill_inputs(self.bufs.input_ids, rs.next_prefill_tokens, idx, qsl,
                                   rs.all_token_ids.gpu, rs.prefill_len.gpu,
                                   rs.num_computed_tokens.gpu)
        prepare_pos_seq_lens(idx, qsl, rs.num_computed_tokens.gpu, self.bufs.positions,
                             self.bufs.seq_lens)
        seq_lens = self.bufs.seq_lens[:n]
        logits_indices = combine_sampled_and_draft_tokens(
            self.bufs.input_ids, idx, rs.last_sampled_tokens, qsl, seq_lens,
            rs.prefill_len.gpu, rs.draft_tokens, cu, total_logits, 1)
        seq_ub = rs.num_computed_tokens_np[idx_np] + sched
        return dict(idx=idx, idx_np=idx_np, expanded=expanded, local=local, cu=cu, qsl=qsl,
                    seq_lens=seq_lens, logits_indices=logits_indices, seq_ub=seq_ub,
                    total_logits=total_logits)

    def context(self, b: dict[str, Any]) -> Any:
        """The ``LogitsContext`` as ``Sampler.apply_sampling_params`` builds it."""
        from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

        return LogitsContext(
            expanded_idx_mapping=b["expanded"], idx_mapping=b["idx"],
            idx_mapping_np=b["idx_np"], expanded_local_pos=b["local"],
            input_ids=self.bufs.input_ids[b["logits_indices"]],
            pos=self.bufs.positions[b["logits_indices"]],
            seq_lens_upper_bound_np=b["seq_ub"])

    def apply(self, logits: Any, ctx: Any) -> Any:
        logits = self.torch.empty_like(logits, dtype=self.torch.float32).copy_(logits)
        for p in self.procs:
            logits = p.apply(logits, ctx)
        return logits

    def commit(self, b: dict[str, Any], sampled: Any, num_sampled: Any) -> Any:
        """The sampler's counts (chunked prefills zeroed) and ``post_update``."""
        from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected, post_update

        rs = self.rs
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            num_sampled, b["seq_lens"], b["cu"], b["idx"], rs.prefill_len.gpu)
        post_update(b["idx"], rs.num_computed_tokens.gpu, rs.last_sampled_tokens, None,
                    sampled, num_sampled, num_rejected, b["qsl"], rs.all_token_ids.gpu,
                    rs.total_len.gpu)
        return num_sampled


def _config(model_dir: str) -> Any:
    return SimpleNamespace(model_config=SimpleNamespace(
        tokenizer=model_dir, get_vocab_size=lambda: VOCAB))


def _params(spec: dict[str, Any] | None, precompiler: Any) -> Any:
    from tests.support.constraint_sim import params

    return params(spec, precompiler)


# --- part 1: correctness over a multi-step scenario ---

def check(args: argparse.Namespace, device: Any, tok: Any, precompiler: Any) -> dict[str, Any]:
    import numpy as np
    import torch
    from tests.support.catalog import make_titles

    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    titles = make_titles(2000)
    specs: list[dict[str, Any] | None] = [
        {"type": "choice", "choices": titles[:300]},
        {"type": "distinct_items", "items": titles[300:340], "min": 1, "max": 3},
        {"type": "distinct_items", "items": titles[400:900], "min": 2, "max": 4},
        {"type": "regex", "pattern": r"[A-Z]{2}-[0-9]{2,4}"},
        {"type": "choice", "choices": ["yes", "no", "maybe not"]},
        None,
    ]
    oracle = Oracle(tok)
    max_reqs, live = args.check_slots, args.check_live
    run = Runner(_config(args.model), device, max_reqs, 512, 4096, 3)
    eos = set(tok.eos_token_ids)
    waiting: list[tuple[int, Req]] = []  # (resume at step, preempted request)
    running: dict[str, Req] = {}
    stats = dict(steps=0, rows=0, constrained_rows=0, draft_rows=0, prefill_rows=0,
                 refill_rows=0, finished=0, preempted=0, resumed=0, rejected_drafts=0,
                 slots_used=set(), max_rows=0, steps_with_drafts=0)
    serial = 0

    def new_req() -> Req:
        nonlocal serial
        serial += 1
        spec = rng.choice(specs)
        prompt = [rng.randrange(100, 5000) for _ in range(rng.randrange(8, 70))]
        return Req(f"r{serial}", spec, prompt, _params(spec, precompiler))

    def allowed(req: Req, history: list[int]) -> set[int]:
        return oracle.allowed(req.spec, history) if req.spec is not None else set()

    for step in range(args.check_steps):
        spec_phase = step >= args.check_steps // 3  # the first third runs without drafts
        # finished and preempted requests leave; new and resumed ones take free slots
        for rid in [r for r, q in running.items() if q.done]:
            run.rs.remove_request(rid)
            del running[rid]
        if step % 3 == 2 and running:
            victims = [q for q in running.values() if q.out and q.computed >= q.prefill_len]
            if victims:
                q = rng.choice(victims)
                run.rs.remove_request(q.rid)
                del running[q.rid]
                waiting.append((step + rng.randrange(1, 4), q))
                stats["preempted"] += 1
        added = False
        for due, q in list(waiting):
            if due <= step and len(running) < max_reqs:
                waiting.remove((due, q))
                run.add(q)
                running[q.rid] = q
                stats["resumed"] += 1
                added = True
        while len(running) < live and len(running) + len(waiting) < max_reqs:
            q = new_req()
            run.add(q)
            running[q.rid] = q
            added = True
        run.flush(added)

        # the scheduler: chunked prefill, drafts for decoding requests, a shuffled order
        batch: list[tuple[Req, int, list[int]]] = []
        order = list(running.values())
        rng.shuffle(order)
        for q in order:
            stats["slots_used"].add(q.slot)
            if q.computed < q.prefill_len:  # (re)prefill, in chunks
                # a resumed request refills in small chunks: its output shows up a bit a time
                size = 3 if q.prefill_len > len(q.prompt) else rng.choice([8, 16, 40])
                chunk = min(q.prefill_len - q.computed, size)
                batch.append((q, chunk, []))
                continue
            drafts: list[int] = []
            if spec_phase:
                for _ in range(rng.randrange(4)):
                    if q.spec is None or rng.random() < 0.25:
                        t = rng.randrange(3, 3000)
                    else:
                        t = rng.choice(sorted(allowed(q, q.out + drafts)))
                    if t in eos:
                        break
                    drafts.append(t)
            batch.append((q, 1 + len(drafts), drafts))
        b = run.prepare(batch)
        ctx = run.context(b)
        original = torch.randn(b["total_logits"], VOCAB, device=device)
        masked = run.apply(original, ctx)

        # every row against a from-scratch replay
        fin = torch.isfinite(masked).cpu().numpy()
        same = (masked == original).all(dim=1).cpu().numpy()
        seq_lens = b["seq_lens"].cpu().numpy()
        row = 0
        sampled = np.zeros((len(batch), run.num_spec + 1), dtype=np.int64)
        num_sampled = np.zeros(len(batch), dtype=np.int32)
        stats["steps"] += 1
        stats["steps_with_drafts"] += any(d for _, _, d in batch)
        stats["max_rows"] = max(stats["max_rows"], b["total_logits"])
        for i, (q, k, drafts) in enumerate(batch):
            assert seq_lens[i] == q.computed + k, (q.rid, seq_lens[i], q.computed, k)
            prefilling = q.computed + k < q.prefill_len
            rows = list(range(row, row + 1 + len(drafts)))
            row += len(rows)
            stats["rows"] += len(rows)
            if q.spec is None:
                assert all(same[r] for r in rows), (step, q.rid, "unconstrained row changed")
            else:
                for j, r in enumerate(rows):
                    if prefilling:
                        visible = max(0, q.computed + k - len(q.prompt))
                        want = allowed(q, q.out[:visible])
                        stats["prefill_rows"] += 1
                        stats["refill_rows"] += visible > 0
                    else:
                        want = allowed(q, q.out + drafts[:j])
                    got = set(np.flatnonzero(fin[r]).tolist())
                    assert got == want, (step, q.rid, q.slot, j, prefilling, len(q.out),
                                         sorted(got)[:10], sorted(want)[:10])
                    stats["constrained_rows"] += 1
                    stats["draft_rows"] += j > 0
            if prefilling:
                continue
            # the rejection sampler: drafts kept while the target row allows them, then a bonus
            accepted = 0
            while accepted < len(drafts) and fin[rows[accepted], drafts[accepted]]:
                accepted += 1
            stats["rejected_drafts"] += accepted < len(drafts)
            choices = np.flatnonzero(fin[rows[accepted]])
            bonus = int(rng.choice(choices[:3000].tolist()))
            tokens = [*drafts[:accepted], bonus]
            sampled[i, :len(tokens)] = tokens
            num_sampled[i] = len(tokens)
        ns = run.commit(b, torch.from_numpy(sampled).to(device),
                        torch.from_numpy(num_sampled).to(device))
        assert (ns.cpu().numpy() == num_sampled).all()
        for i, (q, k, drafts) in enumerate(batch):
            if num_sampled[i] == 0:
                q.computed += k
                continue
            tokens = sampled[i, :num_sampled[i]].tolist()
            q.computed += k - (1 + len(drafts) - len(tokens))
            q.out += tokens
            if tokens[-1] in eos or len(q.out) > 120 or (q.spec is None and len(q.out) > 40):
                q.done = True
                stats["finished"] += 1
        # the device's committed state is the host's truth
        slots = [q.slot for q in running.values()]
        history = run.rs.all_token_ids.gpu[slots].cpu().numpy()
        total = run.rs.total_len.gpu[slots].cpu().numpy()
        computed = run.rs.num_computed_tokens.gpu[slots].cpu().numpy()
        for n, q in enumerate(running.values()):
            assert total[n] == q.total, (step, q.rid, total[n], q.total)
            assert history[n, :q.total].tolist() == q.prompt + q.out, (step, q.rid)
            assert computed[n] == q.computed, (step, q.rid, computed[n], q.computed)
        if step % 10 == 0:
            print(f"check step {step}: {len(batch)} requests, {b['total_logits']} rows",
                  flush=True)
    stats["slots_used"] = len(stats["slots_used"])
    stats["engine_compiles"] = run.proc.engine_compiles
    # the walk really exercised what it is for
    assert all(stats[k] for k in ("draft_rows", "rejected_drafts", "refill_rows", "finished",
                                  "preempted", "resumed", "prefill_rows")), stats
    return stats


# --- part 2: apply at batch 256 ---

def bench(args: argparse.Namespace, device: Any, tok: Any, precompiler: Any,
          drafts: int = 0) -> dict[str, Any]:
    """``apply`` per step at batch ``args.batch``; with ``drafts``, every decoding request
    carries that many (random) draft tokens, so the batch has (1 + drafts) rows per request
    and the sampler here rejects them all (the bonus comes from each request's first row)."""
    import torch
    from tests.support.catalog import make_titles

    rng = random.Random(args.seed + 1)
    titles = make_titles(5000)
    n = args.batch
    t0 = time.perf_counter()
    specs = [{"type": "distinct_items",
              "items": rng.sample(titles, 20 + (480 * i) // max(n - 1, 1)), "min": 1, "max": 3}
             for i in range(n)]
    pool = [(s, _params(s, precompiler)) for s in specs]
    compile_s = time.perf_counter() - t0
    run = Runner(_config(args.model), device, n + 16, 512, max(4096, 64 * (n + 16)), drafts)
    eos = tok.eos_token_ids
    running: dict[int, Req] = {}
    serial = 0

    def fill() -> bool:
        nonlocal serial
        added = False
        while len(running) < n:
            serial += 1
            spec, params = pool[serial % n]
            q = Req(f"b{serial}", spec, [rng.randrange(100, 5000) for _ in range(32)], params)
            run.add(q)
            running[q.slot] = q
            added = True
        return added

    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    times: list[float] = []
    syncs: list[int] = []
    finished = 0
    prof_rows: list[dict[str, int]] = []
    rows: list[int] = []
    for step in range(args.bench_steps):
        run.flush(fill())
        batch = [(q, q.prefill_len - q.computed, []) if q.computed < q.prefill_len
                 else (q, 1 + drafts, [rng.randrange(3, 3000) for _ in range(drafts)])
                 for q in running.values()]
        rng.shuffle(batch)
        b = run.prepare(batch)
        ctx = run.context(b)
        logits = torch.randn(b["total_logits"], VOCAB, device=device)
        logits = torch.empty_like(logits).copy_(logits)
        profile = cuda and step in (args.bench_steps - 3, args.bench_steps - 2)
        sync()
        if profile:
            counts, logits = _profiled(run.proc.apply, logits, ctx)
            prof_rows.append(counts)
        else:
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                start = time.perf_counter()
                logits = run.proc.apply(logits, ctx)
                sync()
                elapsed = time.perf_counter() - start
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
            if step >= 2:  # the first steps compile numba and Triton paths
                times.append(elapsed * 1e3)
                syncs.append(sum("synchroniz" in str(w.message) for w in caught))
        # the sampler on the device: Gumbel argmax over the masked row
        u = torch.rand_like(logits).clamp_(1e-10, 1.0)
        tokens = (logits - torch.log(-torch.log(u))).argmax(dim=-1)[b["cu"][:-1].long()]
        sampled = torch.zeros(len(batch), drafts + 1, dtype=torch.int64, device=device)
        sampled[:, 0] = tokens
        num = torch.ones(len(batch), dtype=torch.int32, device=device)
        ns = run.commit(b, sampled, num)
        host_tokens, host_ns = tokens.cpu().tolist(), ns.cpu().tolist()
        rows.append(b["total_logits"])
        for (q, k, d), t, s in zip(batch, host_tokens, host_ns, strict=True):
            q.computed += k - len(d)  # every draft rejected
            if s:
                q.out.append(t)
                if t in eos or len(q.out) > 200:
                    run.rs.remove_request(q.rid)
                    del running[q.slot]
                    finished += 1
    # the floor any dense mask pays: one write of the batch's logits
    floor: list[float] = []
    big = torch.empty(n, VOCAB, device=device)
    for _ in range(20):
        sync()
        start = time.perf_counter()
        big.fill_(float("-inf"))
        sync()
        floor.append((time.perf_counter() - start) * 1e3)
    q = statistics.quantiles(times, n=10)
    return dict(batch=n, drafts_per_request=drafts, rows_per_step=[min(rows), max(rows)],
                vocab=VOCAB, steps_timed=len(times),
                apply_ms_median=statistics.median(times), apply_ms_p10=q[0],
                apply_ms_p90=q[-1], apply_ms_min=min(times), apply_ms_max=max(times),
                syncs_per_step_flagged=sorted(set(syncs)), profiled_steps=prof_rows,
                fill_floor_ms_median=statistics.median(floor), finished_requests=finished,
                precompile_s=round(compile_s, 2), engine_compiles=run.proc.engine_compiles)


def _profiled(apply: Any, logits: Any, ctx: Any) -> tuple[dict[str, int], Any]:
    """One ``apply`` under torch.profiler: its runtime calls and device copies, counted."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            logits = apply(logits, ctx)
            torch.cuda.synchronize()
    except Exception as e:  # the profiler is a nicety; the timing loop stands without it
        return {"profiler error: " + str(e)[:200]: 1}, logits
    counts: dict[str, int] = {}
    for e in prof.events():
        name = e.name
        if (name.startswith("cuda") and ("Memcpy" in name or "Synchronize" in name
                                          or "LaunchKernel" in name)) or name.startswith("Memcpy"):
            counts[name] = counts.get(name, 0) + 1
    return counts, logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="dry run on CPU (Triton interpreter)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--model", default=None, help="tokenizer dir (default: Podium's model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-steps", type=int, default=60)
    ap.add_argument("--check-slots", type=int, default=40)
    ap.add_argument("--check-live", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--bench-steps", type=int, default=40)
    ap.add_argument("--skip", choices=["check", "bench"], default=None)
    args = ap.parse_args()
    if args.cpu and "--check-slots" not in sys.argv:
        args.check_steps, args.check_slots, args.check_live = 40, 10, 8
        args.batch, args.bench_steps = 16, 8
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    device = _setup(args.cpu)
    import torch

    if args.model is None:
        from podium.package.defaults import default_model_dir

        args.model = str(default_model_dir())
    from podium.constraints.compile.precompile import ConstraintPrecompiler
    from podium.constraints.compile.vocab import TokenizerInfo

    tok = TokenizerInfo.from_pretrained(args.model)
    precompiler = ConstraintPrecompiler(args.model, VOCAB)
    result: dict[str, Any] = dict(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        torch=torch.__version__, python=sys.version.split()[0])
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_v2_check.json")
    failed = []
    parts = (("check", check), ("bench", bench),
             ("bench_drafts", lambda *a: bench(*a, drafts=3)))
    for part, fn in parts:
        if args.skip and part.startswith(args.skip):
            continue
        t = time.perf_counter()
        try:  # one part failing still leaves the other's figures
            result[part] = fn(args, device, tok, precompiler)
            result[part]["seconds"] = round(time.perf_counter() - t, 1)
            print(f"{part} passed:", json.dumps(result[part], default=str), flush=True)
        except Exception:
            import traceback

            failed.append(part)
            result[part + "_error"] = traceback.format_exc()[-4000:]
            print(result[part + "_error"], flush=True)
        result["seconds"] = round(time.perf_counter() - started, 1)
        result["uva_views"] = UVA_VIEWS
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
    print(json.dumps(result, indent=1, default=str))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
