"""The vLLM backend: an LLM or embedding model on the embedded vLLM engine.

`backend` (`VllmBackend`, the model's lifecycle), `engine` (vLLM's arguments and the engine's
start), `engine_build` + `compile_cache` + `compile_key` + `compile_job` (the engine's compiled
build, cached beside the weights); the KServe path: `contract` → `generate` | `scoring` |
`embeddings`, with `sampling` and `checks`; the OpenAI path: `openai` (the `OpenAIService`
over vLLM's serving objects), with `openai_request` (strict subclasses of vLLM's request
models, which run `openai_fields`, `openai_types`, `openai_limits`, `openai_structured`); one
constraint path for both (`constraint`); `schema` (structured-output schemas vLLM would not
honour). Nothing imports vLLM until a model loads or a request needs it.
"""

from podium.backends.vllm.backend import VllmBackend
from podium.backends.vllm.engine import build_engine_args

__all__ = ["VllmBackend", "build_engine_args"]
