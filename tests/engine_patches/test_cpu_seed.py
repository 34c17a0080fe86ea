"""The CPU seed fix on a stand-in runner built from vLLM's own code path and real generators.

`_Runner` reproduces what `GPUModelRunner` does with a seeded request's generator in one step:
the sampler draws from it (`exponential_`, as vLLM's random sampler does), then bookkeeping
rewinds the draws of requests whose token is discarded (a prefill chunk that is not the last).
"""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from podium.engine_patches import cpu_seed


class _Runner:
    def __init__(self, seeds: dict[int, int], discard: list[bool]) -> None:
        generators = {row: torch.Generator().manual_seed(seed) for row, seed in seeds.items()}
        self.input_batch = SimpleNamespace(generators=generators, num_reqs=len(discard))
        self.discard_request_mask = SimpleNamespace(np=np.array(discard, dtype=bool))
        self.sampled: dict[int, torch.Tensor] = {}

    def _sample(self) -> None:
        for row, gen in self.input_batch.generators.items():
            self.sampled[row] = torch.empty(4).exponential_(generator=gen)

    def _bookkeeping_sync(self) -> None:  # vLLM's rewind, as written for CUDA's Philox
        for row in np.nonzero(self.discard_request_mask.np[:self.input_batch.num_reqs])[0]:
            gen = self.input_batch.generators.get(int(row))
            if gen is not None:
                gen.set_offset(gen.get_offset() - 4)


class _Patched(_Runner):
    pass


cpu_seed.patch(_Patched)


def _first_draw(seed: int) -> torch.Tensor:
    return torch.empty(4).exponential_(generator=torch.Generator().manual_seed(seed))


def test_the_unpatched_rewind_is_the_engine_crash() -> None:
    runner = _Runner({0: 7}, discard=[True])
    runner._sample()
    with pytest.raises(RuntimeError, match="does not use offset"):
        runner._bookkeeping_sync()


def test_a_discarded_draw_leaves_no_trace() -> None:
    runner = _Patched({0: 7, 1: 8}, discard=[True, False])
    runner._sample()
    runner._bookkeeping_sync()  # no crash
    # row 0's chunk was discarded: its next draw is its first, as if the chunk never sampled
    after = torch.empty(4).exponential_(generator=runner.input_batch.generators[0])
    assert torch.equal(after, _first_draw(7))
    # row 1 sampled for real: its generator moved on
    assert torch.equal(runner.sampled[1], _first_draw(8))
    nxt = torch.empty(4).exponential_(generator=runner.input_batch.generators[1])
    assert not torch.equal(nxt, _first_draw(8))
    assert set(runner.input_batch.generators) == {0, 1}  # hidden only during bookkeeping


def test_output_does_not_depend_on_how_the_prompt_was_chunked() -> None:
    one_chunk = _Patched({0: 11}, discard=[False])
    one_chunk._sample()
    three_chunks = _Patched({0: 11}, discard=[True])
    for _ in range(2):  # two discarded chunks, then the last one samples
        three_chunks._sample()
        three_chunks._bookkeeping_sync()
    three_chunks.discard_request_mask.np[0] = False
    three_chunks._sample()
    assert torch.equal(three_chunks.sampled[0], one_chunk.sampled[0])


def test_patching_twice_wraps_once() -> None:
    wrapped = _Patched._sample
    cpu_seed.patch(_Patched)
    assert _Patched._sample is wrapped


def test_the_pinned_cpu_engine_gets_the_fix_through_its_plugin_entry_point() -> None:
    assert cpu_seed.applies()
    plugins = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.general_plugins")}
    assert plugins.get("podium_cpu_seed") == "podium.engine_patches.cpu_seed:register"
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    cpu_seed.register()
    assert getattr(CPUModelRunner, "_podium_cpu_seed", False)
