"""Drives the batch logits processor the way vLLM does, without an engine: the specs the
processor tests use, what admission hands the engine, a from-scratch replay oracle, and Model
Runner V2 played with vLLM's own objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm import SamplingParams

from podium.constraints.compile.compiler import ConstraintCompiler
from podium.constraints.compile.precompile import KEY_XARGS
from podium.constraints.compile.vocab import TokenizerInfo
from podium.constraints.engine.processor import ConstraintLogitsProcessor
from podium.constraints.spec.admission import to_vllm_xargs, validate_constraint
from tests.support.catalog import make_titles
from tests.support.walk import Walker

SPECS = [
    {"type": "choice", "choices": make_titles(300)},
    {"type": "distinct_items", "items": make_titles(40), "min": 1, "max": 3},
    {"type": "regex", "pattern": r"[A-Z]{2}-[0-9]{2,4}"},
    None,  # unconstrained
]


def config(smol_dir: Any) -> Any:
    """The slice of vLLM's config the processor reads."""
    return SimpleNamespace(model_config=SimpleNamespace(
        tokenizer=str(smol_dir), get_vocab_size=lambda: 49152))


def params(spec: dict[str, Any] | None, precompiler: Any = None) -> SamplingParams:
    """What admission hands the engine: the normalized spec and, given the precompiler, its
    compiled form's key."""
    if not spec:
        return SamplingParams(max_tokens=64)
    normalized = validate_constraint(spec)
    xargs: dict[str, Any] = to_vllm_xargs(normalized)
    if precompiler is not None:
        key = precompiler.compile_now(normalized).key
        assert key is not None
        xargs[KEY_XARGS] = key
    return SamplingParams(max_tokens=64, extra_args=xargs)


@dataclass
class Req:
    spec: dict[str, Any] | None
    out: list[int] = field(default_factory=list)
    prefill_steps: int = 0  # steps of chunked prefill left (no token sampled)
    done: bool = False


class Oracle:
    """What a single request with this history may take next, replayed from scratch."""

    def __init__(self, tok: TokenizerInfo) -> None:
        self.compiler = ConstraintCompiler(tok)
        self.eos = tok.eos_token_ids

    def allowed(self, req: Req) -> set[int]:
        w = Walker(self.compiler.compile(validate_constraint(req.spec)), self.eos)
        w.history = list(req.out)
        return w.allowed()


class V2Sim:
    """Model Runner V2 with vLLM's own objects: its ``RequestState`` (host buffers, as vLLM's
    CPU worker builds them), its processor loader (our ``vllm.logits_processors`` entry point)
    and its ``LogitsContext``. Only the runner's device kernels (writing sampled tokens into
    ``all_token_ids``) are done by hand here: they are Triton, absent on this CPU."""

    def __init__(self, config: Any, monkeypatch: pytest.MonkeyPatch, max_reqs: int = 8,
                 max_len: int = 256) -> None:
        import vllm.v1.worker.cpu.buffer_utils as cpu_buffers
        import vllm.v1.worker.gpu.buffer_utils as gpu_buffers
        from vllm.v1.worker.gpu.sample.logits_processor.loader import (
            build_custom_logits_processors,
        )
        from vllm.v1.worker.gpu.states import RequestState

        # the swap vLLM's CPU worker makes (vllm.v1.worker.cpu.shm): no pinned memory here
        monkeypatch.setattr(gpu_buffers, "UvaBuffer", cpu_buffers.UvaBuffer)
        self.req_states = RequestState(max_reqs, max_len, 64, 0, 49152, torch.device("cpu"))
        procs = build_custom_logits_processors(config, self.req_states, False)
        [self.proc] = [p for p in procs if isinstance(p, ConstraintLogitsProcessor)]
        self.all_token_ids = self.req_states.all_token_ids.gpu
        self.prompt_len = self.req_states.prompt_len.np

    def ctx(self, slots: list[int], visible: list[int]) -> Any:
        from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

        idx = torch.tensor(slots, dtype=torch.int32)
        pos = torch.tensor(visible, dtype=torch.int64) - 1
        return LogitsContext(
            expanded_idx_mapping=idx, idx_mapping=idx, idx_mapping_np=idx.numpy(),
            expanded_local_pos=torch.zeros(len(slots), dtype=torch.int32),
            input_ids=self.all_token_ids[idx.long(), pos.clamp(min=0)], pos=pos,
            seq_lens_upper_bound_np=np.array(visible, dtype=np.int32))
