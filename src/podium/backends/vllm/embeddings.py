"""Embeddings from a vLLM model of task "embed":

    text_input               BYTES [-1] N texts
    → embedding              FP32  [-1, -1] one vector per text

The engine needs `encode(prompt, pooling_params, request_id)`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from podium.backends.base import InferenceRequest, InferenceResponse, Tensor
from podium.backends.tensor_text import read_texts
from podium.errors import InvalidArgument
from podium.package.manifest import TensorSpec

EMBED_INPUTS = [TensorSpec(name="text_input", datatype="BYTES", shape=[-1])]
EMBED_OUTPUTS = [TensorSpec(name="embedding", datatype="FP32", shape=[-1, -1])]


def vllm_pooling_params() -> Any:
    """vLLM's PoolingParams for embedding (imported on first use)."""
    from vllm import PoolingParams

    return PoolingParams(task="embed")


async def embed(engine: Any, request: InferenceRequest, *,
                pooling_params: Callable[[], Any] = vllm_pooling_params) -> InferenceResponse:
    """One vector per `text_input` string, encoded concurrently."""
    texts = read_texts(request, "text_input")
    if request.parameters:
        raise InvalidArgument(f"embedding requests take no parameters (got "
                              f"{sorted(request.parameters)})", param=sorted(request.parameters)[0])
    base = request.id or uuid.uuid4().hex

    async def one(index: int) -> np.ndarray:
        final = None
        async for output in engine.encode(texts[index], pooling_params(), f"{base}-{index}"):
            final = output
        data = final.outputs.data
        if hasattr(data, "float"):  # a torch tensor
            data = data.float().cpu().numpy()
        return np.asarray(data, dtype=np.float32).reshape(-1)

    vectors = await asyncio.gather(*(one(i) for i in range(len(texts))))
    return InferenceResponse(outputs=[Tensor("embedding", "FP32", np.stack(vectors))],
                             id=request.id)
