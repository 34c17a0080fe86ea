"""A decoupled Python model's responses as an async stream: `execute` runs in a worker thread
and sends through `request.get_response_sender()`; each send is handed to the event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from podium.backends.base import InferenceRequest, InferenceResponse
from podium.triton.model_file import install_utils

if TYPE_CHECKING:
    from podium.triton.python_backend import TritonPythonBackend

_DONE = object()


async def stream(backend: TritonPythonBackend, request: InferenceRequest
                 ) -> AsyncIterator[InferenceResponse]:
    pb_utils = install_utils()
    loop = asyncio.get_running_loop()
    parts: asyncio.Queue[Any] = asyncio.Queue()

    def deliver(response: Any, flags: int) -> None:
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        loop.call_soon_threadsafe(parts.put_nowait, (response, final))

    arrays = {name: tensor.data for name, tensor in request.inputs.items()}
    pb_request = backend._pb_request(arrays, request.id, json.dumps(request.parameters,
                                                                    default=str))
    pb_request._sender = pb_utils.InferenceResponseSender(deliver)

    def run() -> None:
        try:
            backend._execute([pb_request])
        except BaseException as exc:  # handed to the stream's reader
            loop.call_soon_threadsafe(parts.put_nowait, exc)
        loop.call_soon_threadsafe(parts.put_nowait, _DONE)

    task = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        while True:
            item = await parts.get()
            if isinstance(item, BaseException):
                raise item
            if item is _DONE:
                continue  # execute returned; a thread of the model may still send the final
            response, final = item
            yield backend.to_podium(response, request.id, final)
            if final:
                break
    finally:
        await asyncio.shield(task)
