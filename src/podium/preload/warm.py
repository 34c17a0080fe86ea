"""What the preloader imports before it forks engine cores (a fork server's preload module).

Imports only: nothing here may start a thread, an OpenMP pool or a device context, since every
engine core is forked from this process. Any failure is swallowed (a missing module is
imported again by the engine core that needs it).

Then the import's heap is frozen (`podium.heap.freeze`: one collection, then out of the
collector's reach, inherited by every fork). vLLM's engine core runs three full collections
before it reports ready (`freeze_gc_heap`), which otherwise walk every object vLLM, torch and
transformers made at import, on the boot path; the zygote freezes its heap for the same
reason before it forks servers (whose own freeze at ready, `podium.heap`, then walks only what
boot made)."""

from __future__ import annotations

import contextlib
import importlib

from podium import heap

MODULES = (
    "podium.engine_patches.lifecycle",
    "vllm.v1.engine.core",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.models.llama",
)

for _name in MODULES:
    with contextlib.suppress(Exception):  # a preload is an optimisation, never a failure
        importlib.import_module(_name)

heap.freeze()
