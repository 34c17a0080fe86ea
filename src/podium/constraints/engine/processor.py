"""The engine plugin: one batch-level logits processor for every constrained request.

``ConstraintLogitsProcessor`` implements both of vLLM 0.32's interfaces, so one entry point
serves CPU (V1 model runner: ``update_state(BatchUpdate)`` + ``apply(logits)``) and NVIDIA
(Model Runner V2: ``add_request`` + ``apply(logits, ctx)``). A request opts in with
``SamplingParams.extra_args["podium_constraint"]`` (the frontend's ``vllm_xargs``), holding
the JSON of a spec normalized by :func:`podium.constraints.spec.admission.validate_constraint`.

Per step the processor reads each constrained request's output history (V1: the live list
vLLM hands over in ``BatchUpdate.added``; V2: ``req_states.all_token_ids``), advances the
state machines (see :class:`~podium.constraints.engine.batch.ConstraintBatch`) and masks the logits
in one pass. Requests without a constraint cost nothing.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor.interface import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor.interface import (
    LogitsProcessor as V2LogitsProcessor,
)

from podium.constraints.compile.precompile import KEY_XARGS
from podium.constraints.compile.store import FormStore
from podium.constraints.compile.vocab import TokenizerInfo
from podium.constraints.spec.admission import XARGS_KEY, validate_constraint
from podium.errors import InvalidArgument

# The state machines (numba) load on first use, never at import: vLLM's CPU worker crashes at
# start-up if llvmlite is already imported, and a spawned engine process imports this module
# before that point when its config names this class (docs/constraints.md).
if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor.interface import (
        LogitsContext,
        LogitsProcRequestState,
    )

    from podium.constraints.compile.compiler import ConstraintCompiler
    from podium.constraints.compile.form import CompiledForm
    from podium.constraints.engine.batch import ConstraintBatch, FetchTokens

log = logging.getLogger(__name__)


def constraint_spec(params: SamplingParams) -> str | None:
    """The constraint JSON a request carries, if any."""
    extra = params.extra_args
    return extra.get(XARGS_KEY) if extra else None


class ConstraintLogitsProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Applies every request's ``podium_constraint`` to the batch's logits."""

    def __init__(self, vllm_config: VllmConfig, *args: Any) -> None:
        # V1 calls (vllm_config, device, is_pin_memory); V2 calls (vllm_config, req_states)
        self._req_states: LogitsProcRequestState | None = args[0] if len(args) == 1 else None
        self._model_config = vllm_config.model_config
        self._compiler: ConstraintCompiler | None = None  # only for specs not precompiled
        self._store = FormStore()
        self.engine_compiles = 0
        """Constraints compiled in the engine step because admission did not (should be 0)."""
        self._batch: ConstraintBatch | None = None
        self._lists: list[list[int] | None] = []  # V1: live output history per batch index
        # V1: allowed tokens computed in update_state, before the forward pass, for this step's
        # apply: (slots, rows, tokens), or None when apply must work them out itself
        self._prepared: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    # --- shared ---

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Runs at admission in the frontend process; rejects a malformed constraint."""
        spec = constraint_spec(sampling_params)
        if spec is None:
            return
        try:
            validate_constraint(json.loads(spec) if isinstance(spec, str) else spec)
        except (InvalidArgument, json.JSONDecodeError) as e:
            raise ValueError(f"{XARGS_KEY}: {e}") from None

    def is_argmax_invariant(self) -> bool:
        return False  # masking changes which token is the argmax

    def _ensure_batch(self, eos_token_ids: tuple[int, ...]) -> ConstraintBatch:
        if self._batch is None:
            # loaded on first use so engines serving no constrained request never pay for it
            from podium.constraints.engine.batch import ConstraintBatch

            self._batch = ConstraintBatch(eos_token_ids)
        return self._batch

    def _add(self, slot: int, params: SamplingParams) -> bool:
        spec = constraint_spec(params)
        if spec is None:
            if self._batch is not None:
                self._batch.remove(slot)
            return False
        key = params.extra_args.get(KEY_XARGS) if params.extra_args else None
        form = self._store.get(key) if isinstance(key, str) else None
        if form is None:
            # not compiled at admission (a caller that skipped it, a plugin with Python state,
            # a cache file gone): compile here, in the engine step, and count it
            self.engine_compiles += 1
            (log.warning if self.engine_compiles == 1 else log.debug)(
                "a constraint reached the engine without its compiled form (key %s); "
                "compiling it in the engine step (%d so far)", key, self.engine_compiles)
            self._add_compiled_here(slot, spec)
            return True
        batch = self._ensure_batch(form.eos_token_ids)
        if tuple(batch.eos.tolist()) != tuple(sorted(form.eos_token_ids)):
            log.error("constraint compiled for another tokenizer (EOS %s, engine %s); the "
                      "request will end at once", form.eos_token_ids, batch.eos.tolist())
            form = _end_at_once(form.eos_token_ids)
        batch.add(slot, form)
        return True

    def _add_compiled_here(self, slot: int, spec: str | dict[str, Any]) -> None:
        from podium.constraints.compile.compiler import ConstraintCompiler

        if self._compiler is None:
            mc = self._model_config
            tok = TokenizerInfo.from_pretrained(mc.tokenizer, vocab_size=mc.get_vocab_size())
            self._compiler = ConstraintCompiler(tok)
        tok = self._compiler.tok
        batch = self._ensure_batch(tok.eos_token_ids)
        text = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
        try:
            constraint = self._compiler.compile(text)
            form = constraint.lower(key="engine:" + text, vocab_size=tok.vocab_size,
                                    eos_token_ids=tok.eos_token_ids)
        except Exception:
            # admission validates specs, so this is a bug or a plugin failure: fail the
            # request closed (EOS only) rather than take the engine down
            log.exception("constraint failed to compile; the request will end at once")
            form, constraint = _end_at_once(tok.eos_token_ids), None
        if form is not None:
            batch.add(slot, form)
        else:
            assert constraint is not None
            batch.add_constraint(slot, constraint)

    # --- V1 model runner ---

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Apply batch changes, then advance every state machine to the histories, which
        already hold last step's tokens: this runs before the forward pass, while the tables
        and histories are still in cache, so `apply` only writes the mask."""
        if batch_update is not None:
            self._update_batch(batch_update)
        self._prepared = None
        if self._batch is not None:
            prepared, complete = self._prepare_v1()
            # with async scheduling the last tokens are still placeholders here; vLLM fills
            # them in just before sampling, so apply then catches up itself
            self._prepared = prepared if complete else None

    def _update_batch(self, batch_update: BatchUpdate) -> None:
        for index in batch_update.removed:
            if self._batch is not None:
                self._batch.remove(index)
            self._set_list(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            constrained = self._add(index, params)
            # vLLM keeps appending to this very list: reading it later gives the live history
            self._set_list(index, output_ids if constrained else None)
        for a, b, direction in batch_update.moved:
            self._grow_lists(max(a, b) + 1)
            if direction == MoveDirectionality.SWAP:
                if self._batch is not None:
                    self._batch.swap(a, b)
                self._lists[a], self._lists[b] = self._lists[b], self._lists[a]
            else:
                if self._batch is not None:
                    self._batch.move(a, b)
                self._lists[b], self._lists[a] = self._lists[a], None

    def _set_list(self, index: int, value: list[int] | None) -> None:
        self._grow_lists(index + 1)
        self._lists[index] = value

    def _grow_lists(self, size: int) -> None:
        if size > len(self._lists):
            self._lists.extend([None] * (size - len(self._lists)))

    def apply(self, logits: torch.Tensor, ctx: LogitsContext | None = None) -> torch.Tensor:
        if self._batch is None:
            return logits
        if ctx is not None:
            return self._apply_v2(logits, ctx)
        # vLLM calls update_state before every forward pass; without it (direct use) the
        # histories may have grown since, so work it out here
        prepared, self._prepared = self._prepared, None
        slots, keep_slots, keep_tokens = prepared or self._prepare_v1()[0]
        rows = logits.shape[0]
        if len(slots) and slots[-1] >= rows:  # slots ascend: drop any beyond this batch
            keep = keep_slots < rows
            slots = slots[slots < rows]
            keep_slots, keep_tokens = keep_slots[keep], keep_tokens[keep]
        from podium.constraints.engine.masking import keep_only

        return keep_only(logits, slots, keep_slots, keep_tokens)

    def _prepare_v1(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], bool]:
        """Sync the active slots to their histories; return them with their allowed
        ``(slot, token)`` pairs, and whether every history token was known."""
        assert self._batch is not None
        slots = self._batch.active_slots()
        if len(slots) == 0:
            return (slots, slots, slots), True
        lists = list(map(self._lists.__getitem__, slots.tolist()))
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))

        def fetch(pos: np.ndarray, idx: np.ndarray) -> np.ndarray:
            chosen = map(lists.__getitem__, pos.tolist())
            return np.fromiter(map(list.__getitem__, chosen, idx.tolist()),
                               dtype=np.int64, count=len(pos))

        complete = self._batch.sync(slots, lengths, fetch)
        rows, tokens = self._batch.allowed(slots)
        return (slots, slots[rows], tokens), complete

    # --- Model Runner V2 ---

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        return self._add(req_idx, sampling_params)

    def _apply_v2(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        assert self._batch is not None and self._req_states is not None
        batch_slots = np.asarray(ctx.idx_mapping_np, dtype=np.int64)
        if logits.shape[0] != len(batch_slots):  # speculative decoding: rows for drafts
            return self._apply_v2_drafts(logits, ctx)
        positions = np.flatnonzero(self._batch.holds(batch_slots))
        if len(positions) == 0:
            return logits
        slots = batch_slots[positions]
        prompt_len = np.asarray(self._req_states.prompt_len.np, dtype=np.int64)[slots]
        seq_len = np.asarray(ctx.seq_lens_upper_bound_np, dtype=np.int64)[positions]
        # during (re)prefill the visible length is below prompt + output: that reads as a
        # shrink and the replay catches up as the refill proceeds
        lengths = np.maximum(seq_len - prompt_len, 0)
        self._batch.sync(slots, lengths, self._history(slots, prompt_len))
        rows, tokens = self._batch.allowed(slots)
        from podium.constraints.engine.masking import keep_only

        return keep_only(logits, positions, positions[rows], tokens)

    def _apply_v2_drafts(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        """Rows are not requests: a request owns one row per draft token plus one. Its first
        row (local offset 0) predicts the token after its committed history; the row at
        offset k predicts the one after draft tokens 1..k, which were fed to the rows at
        offsets 1..k. The committed state advances as without drafts; draft rows are masked
        from scratch copies stepped through the drafts (`ConstraintBatch.peek`), so rejected
        drafts leave nothing behind: the next step's history says which were accepted."""
        assert self._batch is not None and self._req_states is not None
        # the step's layout in one device -> host copy (4 x rows integers)
        layout = torch.stack([t.to(torch.int64) for t in (
            ctx.expanded_idx_mapping, ctx.expanded_local_pos, ctx.pos, ctx.input_ids)])
        row_slot, local, pos, fed = layout.cpu().numpy()
        constrained = np.flatnonzero(self._batch.holds(row_slot))
        if len(constrained) == 0:
            return logits
        heads = constrained[local[constrained] == 0]
        slots = row_slot[heads]
        prompt_len = np.asarray(self._req_states.prompt_len.np, dtype=np.int64)[slots]
        # the head row's position is the last committed token's: pos + 1 tokens are visible
        lengths = np.maximum(pos[heads] + 1 - prompt_len, 0)
        self._batch.sync(slots, lengths, self._history(slots, prompt_len))
        rows, tokens = self._batch.allowed(slots)
        keep_rows, keep_tokens = [heads[rows]], [tokens]
        # by slot id (below the batch's capacity), not by a sort of the rows' slots
        owner, offset = row_slot[constrained], local[constrained]
        headed = np.zeros(int(owner.max()) + 1, dtype=bool)
        headed[slots] = True  # a draft row counts only with its request's committed row
        tails = constrained[(offset > 0) & headed[owner]]
        if len(tails):
            fed_by = np.full((len(headed), int(offset.max()) + 1), -1, np.int64)
            fed_by[owner, offset] = fed[constrained]  # slot x offset -> token fed there
            rows, tokens = self._batch.peek(row_slot[tails], fed_by[row_slot[tails], 1:],
                                            local[tails])
            keep_rows.append(tails[rows])
            keep_tokens.append(tokens)
        else:
            tails = tails.astype(np.int64)
        from podium.constraints.engine.masking import keep_only

        return keep_only(logits, np.concatenate([heads, tails]), np.concatenate(keep_rows),
                         np.concatenate(keep_tokens))

    def _history(self, slots: np.ndarray, prompt_len: np.ndarray) -> FetchTokens:
        """`ConstraintBatch.sync`'s fetch over V2's on-device committed token history."""
        assert self._req_states is not None
        history = self._req_states.all_token_ids.gpu

        def fetch(pos: np.ndarray, idx: np.ndarray) -> np.ndarray:
            # one host -> device copy of the (slot, column) pairs, for which torch adds no
            # stream sync; the copy back waits for the step's work (bench/gpu_v2_check.py)
            where = torch.from_numpy(np.stack([slots[pos], prompt_len[pos] + idx]))
            s, c = where.to(history.device, non_blocking=True)
            return history[s, c].to(torch.int64).cpu().numpy()

        return fetch


@cache
def _end_at_once(eos_token_ids: tuple[int, ...]) -> CompiledForm:
    """A form with no edges and no accepting state: the batch allows only EOS."""
    from podium.constraints.compile.form import table_form
    from podium.constraints.compile.table import TokenTable

    table = TokenTable.from_edges(1, np.zeros((0, 3)), [], 0, 1)
    return table_form(table, key="engine:end-at-once", eos_token_ids=eos_token_ids)
