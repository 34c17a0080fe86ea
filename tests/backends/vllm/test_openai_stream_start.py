"""The vLLM backend's OpenAI service reads a stream's first chunk before answering
(`_first_chunk`): an error event there becomes the response's status; anything else is
relayed whole, first chunk included; a request cancelled while it waits for its first chunk
closes the stream (vLLM aborts a request whose generator is closed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from podium.backends.vllm.openai import _first_chunk

ERROR = {"error": {"message": "Grammar error: Unimplemented keys", "type": "BadRequestError",
                   "param": None, "code": 400}}


async def _chunks(*chunks: str, closed: list[bool] | None = None,
                  wait: asyncio.Event | None = None,
                  waiting: asyncio.Event | None = None) -> AsyncIterator[str]:
    try:
        if wait is not None:
            if waiting is not None:
                waiting.set()
            await wait.wait()
        for chunk in chunks:
            yield chunk
    finally:
        if closed is not None:
            closed.append(True)


async def _read(result: object) -> list[str]:
    return [chunk async for chunk in result]  # type: ignore[attr-defined]


def test_an_error_as_the_first_event_is_returned_as_the_error_and_the_stream_closed() -> None:
    closed: list[bool] = []

    async def go() -> object:
        return await _first_chunk(_chunks(f"data: {json.dumps(ERROR)}\n\n", "data: [DONE]\n\n",
                                          closed=closed))

    result = asyncio.run(go())
    assert result.error.code == 400 and "Grammar" in result.error.message  # type: ignore
    assert closed == [True]


def test_a_good_stream_is_relayed_whole_first_chunk_included() -> None:
    chunks = ['data: {"choices": []}\n\n', 'data: {"error_rate": 1}\n\n', "data: [DONE]\n\n"]

    async def go() -> list[str]:
        return await _read(await _first_chunk(_chunks(*chunks)))

    assert asyncio.run(go()) == chunks  # a later chunk that mentions "error" is content


def test_an_empty_stream_and_a_plain_answer_pass_through() -> None:
    async def go() -> tuple[list[str], object]:
        return await _read(await _first_chunk(_chunks())), await _first_chunk({"id": 1})

    empty, plain = asyncio.run(go())
    assert empty == [] and plain == {"id": 1}


def test_cancelled_while_waiting_for_the_first_chunk_closes_the_stream() -> None:
    closed: list[bool] = []

    async def go() -> None:
        waiting = asyncio.Event()
        task = asyncio.ensure_future(_first_chunk(_chunks("data: x\n\n", closed=closed,
                                                          wait=asyncio.Event(),
                                                          waiting=waiting)))
        await asyncio.wait_for(waiting.wait(), 5)  # the stream waits for its first chunk
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert closed == [True]
