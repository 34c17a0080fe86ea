"""Seeded sampling under chunked prefill on vLLM's CPU runner, fixed at the engine's own depth.

The crash: when a request's prompt is prefilled in chunks, every chunk but the last still goes
through the sampler, and the token drawn for it is discarded. vLLM's model runner then winds
the request's generator back so the discarded draw leaves no trace
(`GPUModelRunner._bookkeeping_sync`: `gen.set_offset(gen.get_offset() - 4)`), which keeps a
seeded request's output independent of how its prompt was chunked. That rewind is written for
CUDA's Philox generator, which is a counter with an offset; a CPU `torch.Generator` is a
Mersenne Twister with no offset, so `get_offset` raises `CPU Generator does not use offset` and
the exception kills the engine core. `CPUModelRunner` inherits the method unchanged.

The fix keeps vLLM's intent with what a CPU generator has: `get_state` / `set_state`. Before the
sampler runs, the state of every seeded request whose draw will be discarded is saved; after
it, the state is put back, so the discarded draw leaves no trace, as the rewind meant. The
rewind itself is then skipped for those requests (their generators are hidden from the
bookkeeping step for its duration). Requests without a seed use the global generator and were
never affected.

Installed as a vLLM general plugin (`vllm.general_plugins` entry point), which vLLM runs in
every process, the engine core's worker included, before a model runner is built. It patches
only the pinned engine version and only when the methods it wraps are there, so another
engine version falls back to Podium refusing seeded requests under chunked prefill
(`VllmBackend.check_seed`) rather than to an unchecked patch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("podium.engine_patches")
_MARK = "_podium_cpu_seed"
PATCHED_METHODS = ("_sample", "_bookkeeping_sync")


def register() -> None:
    """The `vllm.general_plugins` entry point: patch the CPU runner where it applies."""
    if not applies():
        return
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    patch(CPUModelRunner)


def applies() -> bool:
    """Whether this engine gets the fix: the pinned vLLM, on CPU, with the methods it wraps.

    The frontend asks the same question to decide whether a seeded request may be served
    with chunked prefill on, so both processes agree without talking."""
    try:
        import vllm
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except Exception:  # no CPU runner in this build (an NVIDIA one): nothing to fix
        return False
    from podium.engine import ENGINE_VERSION

    return (vllm.__version__.split("+")[0] == ENGINE_VERSION
            and all(hasattr(CPUModelRunner, name) for name in PATCHED_METHODS))


def patch(runner_cls: type) -> None:
    """Wrap `runner_cls`'s sampling and bookkeeping steps; a second call does nothing."""
    if getattr(runner_cls, _MARK, False):
        return
    runner_cls._sample = _keeping_discarded_draws(runner_cls._sample)
    runner_cls._bookkeeping_sync = _without_offset_rewind(runner_cls._bookkeeping_sync)
    setattr(runner_cls, _MARK, True)
    log.debug("patched %s for seeded sampling under chunked prefill", runner_cls.__name__)


def discarded_generators(runner: Any) -> dict[int, Any]:
    """Row → generator of this step's seeded requests whose sampled token is thrown away."""
    generators = runner.input_batch.generators
    if not generators:
        return {}
    mask = runner.discard_request_mask.np[:runner.input_batch.num_reqs]
    return {int(row): generators[int(row)] for row in mask.nonzero()[0]
            if int(row) in generators}


def _keeping_discarded_draws(sample: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(sample)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = [(gen, gen.get_state()) for gen in discarded_generators(self).values()]
        result = sample(self, *args, **kwargs)
        for gen, state in saved:
            gen.set_state(state)
        return result

    return wrapper


def _without_offset_rewind(bookkeeping: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(bookkeeping)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _hidden(self.input_batch.generators, discarded_generators(self)):
            return bookkeeping(self, *args, **kwargs)

    return wrapper


@contextmanager
def _hidden(generators: dict[int, Any], rows: dict[int, Any]) -> Iterator[None]:
    """Take `rows` out of `generators` for the block (the state was already restored)."""
    for row in rows:
        del generators[row]
    try:
        yield
    finally:
        generators.update(rows)
