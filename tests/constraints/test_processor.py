"""The batch processor driven like vLLM drives it, with synthetic batch updates.

A small simulator plays the V1 persistent batch (adds, removals with condensing moves, swaps,
chunked prefill, discarded tokens, preemption and resumption) and Model Runner V2 (slots and
on-device token history, on vLLM's own V2 objects: its loader, ``RequestState`` and
``LogitsContext``). After every step each constrained row's finite logits must be
exactly what a fresh replay of that request's history allows; other rows stay untouched.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

from podium.constraints.compile.vocab import TokenizerInfo
from podium.constraints.engine.processor import ConstraintLogitsProcessor
from tests.support.constraint_sim import SPECS, Oracle, Req, V2Sim, params
from tests.support.constraint_sim import config as _config

_PRECOMPILER: list[Any] = []


@pytest.fixture(autouse=True)
def _use_precompiler(precompiler: Any) -> None:
    _PRECOMPILER[:] = [precompiler]


def _params(spec: dict[str, Any] | None, *, precompiled: bool = True) -> SamplingParams:
    return params(spec, _PRECOMPILER[0] if precompiled else None)


class V1Sim:
    """The V1 persistent batch: rows are batch indices, histories are live lists.

    Mirrors ``InputBatch``: removals leave holes, adds fill the lowest holes first, then
    ``condense`` moves the last rows into the remaining holes, then reordering swaps.
    """

    def __init__(self, proc: ConstraintLogitsProcessor, rng: random.Random) -> None:
        self.proc, self.rng = proc, rng
        self.slots: list[Req | None] = []
        self.removed: list[int] = []
        self.added: list[tuple[int, SamplingParams, list[int], list[int]]] = []
        self.moved: list[tuple[int, int, MoveDirectionality]] = []

    @property
    def rows(self) -> list[Req]:
        assert all(r is not None for r in self.slots)
        return self.slots  # type: ignore[return-value]

    def add(self, req: Req) -> None:
        holes = sorted(set(self.removed) - {a[0] for a in self.added})
        index = holes[0] if holes else len(self.slots)
        if index == len(self.slots):
            self.slots.append(req)
        self.slots[index] = req
        self.added.append((index, _params(req.spec), [1, 2, 3], req.out))

    def remove(self, index: int) -> Req:
        req = self.slots[index]
        assert req is not None
        self.slots[index] = None
        self.removed.append(index)
        return req

    def flush(self, swap: tuple[int, int] | None = None) -> None:
        # condense: the last rows fill the holes
        while None in self.slots:
            hole = self.slots.index(None)
            last = len(self.slots) - 1
            if self.slots[last] is None:
                self.slots.pop()
                continue
            self.slots[hole] = self.slots.pop()
            self.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        if swap and max(swap) < len(self.slots):
            a, b = swap
            self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
            self.moved.append((a, b, MoveDirectionality.SWAP))
        update = None
        if self.removed or self.added or self.moved:
            update = BatchUpdate(len(self.slots), self.removed, self.added, self.moved)
        self.proc.update_state(update)
        self.removed, self.added, self.moved = [], [], []


def _check_and_sample(logits: torch.Tensor, original: torch.Tensor, rows: list[Req],
                      oracle: Oracle, rng: random.Random) -> None:
    for i, req in enumerate(rows):
        finite = set(torch.isfinite(logits[i]).nonzero().flatten().tolist())
        if req.spec is None:
            assert torch.equal(logits[i], original[i]), "unconstrained row was modified"
        else:
            assert finite == oracle.allowed(req), f"row {i} mask differs from a replay"
            kept = sorted(finite)
            assert torch.equal(logits[i, kept], original[i, kept]), "kept logits changed"
        if req.prefill_steps > 0:
            req.prefill_steps -= 1  # a prefill chunk: the sampled token is discarded
            continue
        choice = rng.choice(sorted(finite)) if req.spec else rng.randrange(3, 1000)
        if choice in oracle.eos:
            req.done = True
        else:
            req.out.append(choice)


@pytest.mark.parametrize("seed", range(3))
def test_v1_masks_match_replay_through_batch_churn(smol_dir: Any, tok: TokenizerInfo,
                                                   seed: int) -> None:
    rng = random.Random(seed)
    proc = ConstraintLogitsProcessor(_config(smol_dir), torch.device("cpu"), False)
    oracle = Oracle(tok)
    sim = V1Sim(proc, rng)
    parked: list[Req] = []  # preempted requests, history kept, waiting to resume
    for _ in range(6):
        sim.add(Req(rng.choice(SPECS), prefill_steps=rng.randrange(3)))
    for _step in range(40):
        # batch changes between steps, as the scheduler makes them
        for i, req in enumerate(sim.rows):
            if req.done:
                sim.remove(i)
        live = [i for i, r in enumerate(sim.slots) if r is not None]
        if live and rng.random() < 0.3:
            parked.append(sim.remove(rng.choice(live)))  # preempted
        if parked and rng.random() < 0.4:
            req = parked.pop(0)
            req.prefill_steps = rng.randrange(3)  # recomputed in chunks on resume
            sim.add(req)
        if rng.random() < 0.5:
            sim.add(Req(rng.choice(SPECS), prefill_steps=rng.randrange(3)))
        if rng.random() < 0.2:
            # tokens discarded in place (e.g. a failed KV load): the live list shrinks
            victim = rng.choice([r for r in sim.slots if r is not None] or [None])
            if victim and victim.out:
                del victim.out[rng.randrange(len(victim.out)):]
        n = len(sim.slots)
        sim.flush(tuple(rng.sample(range(n), 2)) if n > 1 and rng.random() < 0.3 else None)
        if not sim.rows:
            continue
        original = torch.randn(len(sim.rows), 49152)
        logits = proc.apply(original.clone())
        _check_and_sample(logits, original, sim.rows, oracle, rng)


def _one_request(smol_dir: Any, spec: dict | None) -> tuple[ConstraintLogitsProcessor, Req,
                                                            V1Sim]:
    """A V1 processor with one request added (its batch update delivered)."""
    proc = ConstraintLogitsProcessor(_config(smol_dir), torch.device("cpu"), False)
    req = Req(spec)
    sim = V1Sim(proc, random.Random(0))
    sim.add(req)
    sim.flush()
    return proc, req, sim


def test_v1_history_rewritten_at_same_length_is_replayed(smol_dir: Any,
                                                         tok: TokenizerInfo) -> None:
    spec = {"type": "choice", "choices": ["Alien", "Aliens", "Heat"]}
    proc, req, _sim = _one_request(smol_dir, spec)
    heat = tok.encode_batch(["Heat"])[0]
    proc.apply(torch.zeros(1, 49152))
    req.out.append(tok.encode_batch(["Alien"])[0][0])
    proc.apply(torch.zeros(1, 49152))
    req.out[-1] = heat[0]  # same length, different token
    logits = proc.apply(torch.zeros(1, 49152))
    assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == \
        Oracle(tok).allowed(req)


def test_v1_async_scheduling_placeholders_filled_after_update_state(smol_dir: Any,
                                                                     tok: TokenizerInfo) -> None:
    # with async scheduling vLLM appends -1 for the token still on the device, calls
    # update_state, and writes the real token just before sampling (apply)
    spec = {"type": "choice", "choices": ["Alien", "Aliens", "Heat"]}
    proc, req, sim = _one_request(smol_dir, spec)
    proc.apply(torch.zeros(1, 49152))
    for token in tok.encode_batch(["Heat"])[0]:
        req.out.append(-1)
        sim.flush()
        req.out[-1] = token
        logits = proc.apply(torch.zeros(1, 49152))
        assert set(torch.isfinite(logits[0]).nonzero().flatten().tolist()) == \
            Oracle(tok).allowed(req)


def test_complete_constraint_allows_only_eos(smol_dir: Any, tok: TokenizerInfo) -> None:
    proc, req, sim = _one_request(smol_dir, {"type": "choice", "choices": ["Heat"]})
    req.out.extend(tok.encode_batch(["Heat"])[0])
    sim.flush()  # vLLM calls update_state (no batch change) before every forward pass
    logits = proc.apply(torch.randn(1, 49152))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == list(tok.eos_token_ids)


def test_validate_params_rejects_a_malformed_constraint() -> None:
    bad = SamplingParams(extra_args={"podium_constraint": json.dumps(
        {"type": "distinct_items", "items": ["a"], "min": 2, "max": 1})})
    with pytest.raises(ValueError, match="min=2"):
        ConstraintLogitsProcessor.validate_params(bad)
    ConstraintLogitsProcessor.validate_params(SamplingParams())  # no constraint: fine


def test_v2_admission_runs_through_vllms_validator() -> None:
    # what Model Runner V2's frontend builds from the installed entry point
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.worker.gpu.sample.logits_processor.loader import (
        build_custom_logits_processors_params_validator,
    )

    validate = build_custom_logits_processors_params_validator(())
    with pytest.raises(VLLMValidationError, match="choices is empty"):
        validate(SamplingParams(extra_args={"podium_constraint": json.dumps(
            {"type": "choice", "choices": []})}))
    validate(_params({"type": "choice", "choices": ["Heat"]}))


def test_requests_without_constraints_cost_nothing(smol_dir: Any) -> None:
    proc, _req, _sim = _one_request(smol_dir, None)
    original = torch.randn(1, 49152)
    assert torch.equal(proc.apply(original.clone()), original)
    assert proc._batch is None  # the tokenizer was never loaded


def test_v2_slots_prefill_and_preemption(smol_dir: Any, tok: TokenizerInfo,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    oracle = Oracle(tok)
    sim = V2Sim(_config(smol_dir), monkeypatch)
    rng = random.Random(1)
    reqs = {0: Req(SPECS[0]), 3: Req(SPECS[1]), 5: Req(None)}
    for slot, req in reqs.items():
        sim.prompt_len[slot] = 40
        assert sim.proc.add_request(slot, _params(req.spec)) == (req.spec is not None)
    for step in range(30):
        slots = sorted(reqs)
        rows = [reqs[s] for s in slots]
        visible = []
        for s in slots:
            n = sim.prompt_len[s] + len(reqs[s].out)
            # the first two steps prefill the prompt in chunks: fewer tokens visible
            visible.append(min(n, 16 * (step + 1)))
            sim.all_token_ids[s, sim.prompt_len[s]: n] = torch.tensor(reqs[s].out,
                                                                      dtype=torch.int32)
        for s, req in zip(slots, rows, strict=True):
            req.prefill_steps = 1 if visible[slots.index(s)] < sim.prompt_len[s] else 0
        original = torch.randn(len(slots), 49152)
        logits = sim.proc.apply(original.clone(), sim.ctx(slots, visible))
        for i, req in enumerate(rows):
            if req.spec is not None and req.prefill_steps:
                # still prefilling: the constraint is at its start
                assert set(torch.isfinite(logits[i]).nonzero().flatten().tolist()) == \
                    oracle.allowed(Req(req.spec))
        _check_and_sample(logits, original, rows, oracle, rng)
        for s in list(reqs):
            if reqs[s].done:
                reqs[s] = Req(rng.choice(SPECS))  # slot recycled for a new request
                sim.proc.add_request(s, _params(reqs[s].spec))
        if step == 12:
            # preempt slot 3 and resume it in slot 6 with its history as prompt + output
            req = reqs.pop(3)
            reqs[6] = req
            sim.prompt_len[6] = 40
            sim.proc.add_request(6, _params(req.spec))
