"""The engine core loads its tokenizer while its worker loads the model, not after.

vLLM 0.32's engine core needs the tokenizer only for structured outputs
(`StructuredOutputManager`, built once the KV cache is up) and loads it there, on its one
thread: ~0.6 s for SmolLM2's tokenizer.json on this machine, on the boot path after the
worker has loaded the weights and allocated the cache. Meanwhile, during the worker's start
(`WorkerProc.wait_for_ready`: weights, model set-up, 1-2 s here), the engine core only waits
on a pipe. So the load is started then, in a thread, and the structured-output manager's call
joins it: vLLM's own `cached_get_tokenizer` (an LRU cache) then returns the loaded tokenizer.

The thread starts only after the worker process exists (it is forked from the engine core by
`podium.preload.worker`; a fork while the thread ran would copy its locks), loads nothing but
the tokenizer vLLM would load itself with the same arguments, and a failure in it only means
vLLM loads the tokenizer itself as before. Applied as a vLLM general plugin in the engine
core, on the pinned engine only.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

log = logging.getLogger("vllm.podium.engine_patches")  # runs in the engine: under its logging
_MARK = "_podium_tokenizer_prefetch"
_state: dict[str, Any] = {}
"""The engine core's `vllm_config` (from its executor's start) and the prefetch thread."""


def register() -> None:
    """The `vllm.general_plugins` entry point."""
    if not applies():
        return
    import vllm.v1.structured_output as structured
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc

    # plugins load inside EngineCore.__init__, so its executor's start is the first call
    # made after this that sees the config
    if getattr(MultiprocExecutor._init_executor, _MARK, False):
        return
    MultiprocExecutor._init_executor = _remembering(MultiprocExecutor._init_executor)
    WorkerProc.wait_for_ready = staticmethod(_prefetching(WorkerProc.wait_for_ready))
    structured.cached_tokenizer_from_config = _joining(structured.cached_tokenizer_from_config)


def applies() -> bool:
    from podium.engine import ENGINE_VERSION, installed_engine

    found = installed_engine()
    if found is None or found[1] != ENGINE_VERSION:
        return False
    try:
        import vllm.v1.structured_output as structured
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc
    except ImportError:
        return False
    return (hasattr(structured, "cached_tokenizer_from_config")
            and hasattr(WorkerProc, "wait_for_ready")
            and hasattr(MultiprocExecutor, "_init_executor"))


def _remembering(init_executor: Any) -> Any:
    @functools.wraps(init_executor)
    def _init_executor(self: Any) -> None:
        _state["config"] = self.vllm_config
        init_executor(self)

    setattr(_init_executor, _MARK, True)
    return _init_executor


def _prefetching(wait_for_ready: Any) -> Any:
    @functools.wraps(wait_for_ready)
    def wait(*args: Any, **kwargs: Any) -> Any:
        start()
        return wait_for_ready(*args, **kwargs)

    return wait


def start() -> None:
    """Start loading the engine core's tokenizer in a thread (once)."""
    config = _state.get("config")
    if config is None or "thread" in _state or config.model_config.skip_tokenizer_init:
        return
    from vllm.tokenizers import cached_tokenizer_from_config

    def load() -> None:
        try:
            cached_tokenizer_from_config(model_config=config.model_config)
        except Exception:  # vLLM loads it itself (and reports its own error)
            log.debug("tokenizer prefetch failed", exc_info=True)

    thread = threading.Thread(target=load, name="podium-tokenizer-prefetch", daemon=True)
    _state["thread"] = thread
    thread.start()
    log.info("engine core: its tokenizer loads while the worker starts")


def _joining(load: Any) -> Any:
    @functools.wraps(load)
    def cached_tokenizer_from_config(*args: Any, **kwargs: Any) -> Any:
        thread = _state.get("thread")
        if thread is not None:
            thread.join()
        return load(*args, **kwargs)

    return cached_tokenizer_from_config
