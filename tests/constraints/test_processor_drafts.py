"""Model Runner V2 with speculative decoding: one logits row per draft token plus one.

vLLM 0.32's V2 interface hands the processor rows, not requests: a request with k draft tokens
owns k + 1 rows (local offsets 0..k), reordered every step, and the drafts are only in the
rows' input ids, never in the committed history. Played here with vLLM's own V2 objects
(`RequestState`, its processor loader, `LogitsContext`) and a drafter that proposes valid and
invalid continuations; the sampler's acceptance (a draft is kept while the target's masked row
allows it, then one bonus token) is played by hand. Every row's finite logits must be what a
from-scratch replay of the committed history plus that row's drafts allows.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from podium.constraints.compile.vocab import TokenizerInfo
from tests.support.constraint_sim import SPECS, Oracle, Req, V2Sim, config, params

PROMPT_LEN = 20


def _finite(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def _drafts(oracle: Oracle, req: Req, k: int, rng: random.Random) -> list[int]:
    """k proposals: mostly a token the constraint allows next, sometimes any token."""
    out: list[int] = []
    for _ in range(k):
        if req.spec is None or rng.random() < 0.25:
            token = rng.randrange(3, 1000)
        else:
            token = rng.choice(sorted(oracle.allowed(Req(req.spec, req.out + out))))
        if token in oracle.eos:
            break
        out.append(token)
    return out


def _context(sim: V2Sim, reqs: dict[int, Req], drafts: dict[int, list[int]],
             order: list[int]) -> tuple[Any, list[tuple[int, int]]]:
    """This step's `LogitsContext`, rows of each request together in `order`; and each row's
    (slot, local offset)."""
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

    rows: list[tuple[int, int]] = []
    fed: list[int] = []
    pos: list[int] = []
    for slot in order:
        req = reqs[slot]
        committed = PROMPT_LEN + len(req.out)
        sim.all_token_ids[slot, PROMPT_LEN:committed] = torch.tensor(req.out, dtype=torch.int32)
        last = int(sim.all_token_ids[slot, committed - 1])
        for j, token in enumerate([last, *drafts[slot]]):
            rows.append((slot, j))
            fed.append(token)
            pos.append(committed - 1 + j)
    idx = torch.tensor(order, dtype=torch.int32)
    return LogitsContext(
        expanded_idx_mapping=torch.tensor([s for s, _ in rows], dtype=torch.int32),
        idx_mapping=idx, idx_mapping_np=idx.numpy(),
        expanded_local_pos=torch.tensor([j for _, j in rows], dtype=torch.int32),
        input_ids=torch.tensor(fed, dtype=torch.int32),
        pos=torch.tensor(pos, dtype=torch.int64),
        seq_lens_upper_bound_np=np.array(
            [PROMPT_LEN + len(reqs[s].out) + len(drafts[s]) for s in order], dtype=np.int32),
    ), rows


@pytest.mark.parametrize("seed", range(2))
def test_draft_rows_are_masked_as_their_drafts_leave_the_state_and_rejects_leave_nothing(
        smol_dir: Any, tok: TokenizerInfo, precompiler: Any,
        monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    oracle = Oracle(tok)
    sim = V2Sim(config(smol_dir), monkeypatch)
    reqs = {0: Req(SPECS[0]), 2: Req(SPECS[1]), 4: Req(SPECS[2]), 5: Req(None)}
    for slot, req in reqs.items():
        sim.prompt_len[slot] = PROMPT_LEN
        sim.all_token_ids[slot, :PROMPT_LEN] = torch.arange(100, 100 + PROMPT_LEN)
        assert sim.proc.add_request(slot, params(req.spec, precompiler)) == (req.spec is not None)
    num_draft_rows = num_rejected = num_finished = 0
    for _step in range(30):
        drafts = {s: _drafts(oracle, r, rng.randrange(4), rng) for s, r in reqs.items()}
        order = sorted(reqs)
        rng.shuffle(order)  # rows are reordered every step
        ctx, rows = _context(sim, reqs, drafts, order)
        original = torch.randn(len(rows), 49152)
        logits = sim.proc.apply(original.clone(), ctx)

        for i, (slot, j) in enumerate(rows):
            req = reqs[slot]
            if req.spec is None:
                assert torch.equal(logits[i], original[i]), "unconstrained row was modified"
                continue
            seen = Req(req.spec, req.out + drafts[slot][:j])
            assert _finite(logits[i]) == oracle.allowed(seen), (slot, j, "mask differs")
            num_draft_rows += j > 0
        # the sampler: drafts kept while the target row allows them, then one bonus token
        for slot in order:
            req, mine = reqs[slot], [i for i, (s, _) in enumerate(rows) if s == slot]
            accepted = 0
            while (accepted < len(drafts[slot])
                   and drafts[slot][accepted] in _finite(logits[mine[accepted]])):
                accepted += 1
            num_rejected += accepted < len(drafts[slot])
            bonus = rng.choice(sorted(_finite(logits[mine[accepted]])))
            req.out += drafts[slot][:accepted]
            if bonus in oracle.eos or len(req.out) > 150:
                num_finished += req.spec is not None
                reqs[slot] = Req(rng.choice(SPECS))  # the slot is recycled
                sim.prompt_len[slot] = PROMPT_LEN
                sim.proc.add_request(slot, params(reqs[slot].spec, precompiler))
            else:
                req.out.append(bonus)
    # the walk really exercised drafts, rejections and whole answers
    assert num_draft_rows > 20 and num_rejected > 5 and num_finished > 2, (
        num_draft_rows, num_rejected, num_finished)
