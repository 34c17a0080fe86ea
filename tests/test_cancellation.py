"""The disconnect primitive on its own: a client that leaves cancels the work, one that stays
gets the answer, and the request's task carries on normally either way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from podium import cancellation
from podium.cancellation import WATCH_AFTER_S, ClientLeft, unless_client_leaves
from tests.support.polling import async_eventually


class Connection:
    """uvicorn's receive() once the body is read: waits for the disconnect."""

    def __init__(self, chunks: int = 0) -> None:
        self.gone = asyncio.Event()
        self.chunks = chunks
        self.num_receives = 0

    async def receive(self) -> dict[str, Any]:
        self.num_receives += 1
        if self.chunks:  # a body chunk nobody reads (a client sending more than it said)
            self.chunks -= 1
            return {"type": "http.request", "body": b"x", "more_body": True}
        await self.gone.wait()
        return {"type": "http.disconnect"}


class SlowWork:
    """Work that takes `seconds` unless cancelled; records what happened to it."""

    def __init__(self, seconds: float = 10.0, *, swallow: bool = False) -> None:
        self.seconds = seconds
        self.swallow = swallow
        self.cancelled = False

    async def __call__(self) -> str:
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            if self.swallow:  # as vLLM's full generators answer "Client disconnected"
                return "error response"
            raise
        return "answer"


def test_fast_work_is_answered_without_a_watcher() -> None:
    async def main() -> None:
        connection = Connection()
        assert await unless_client_leaves(connection.receive, SlowWork(0.001)()) == "answer"
        assert connection.num_receives == 0  # never watched: it was done before WATCH_AFTER_S
        loop = asyncio.get_running_loop()
        assert await async_eventually(lambda: loop not in cancellation._sweepers)  # nothing left

    asyncio.run(main())


def test_slow_work_is_answered_while_the_client_stays() -> None:
    async def main() -> None:
        connection = Connection()
        assert await unless_client_leaves(connection.receive,
                                          SlowWork(WATCH_AFTER_S * 4)()) == "answer"
        assert connection.num_receives == 1  # watched, and the watcher is gone

    asyncio.run(main())


@pytest.mark.parametrize(("swallow", "chunks"), [(False, 0), (True, 0), (False, 2)],
                         ids=["cancelled", "work-swallows-the-cancel", "after-stray-chunks"])
def test_a_client_that_leaves_cancels_the_work(swallow: bool, chunks: int) -> None:
    async def main() -> None:
        connection = Connection(chunks)
        work = SlowWork(swallow=swallow)  # 10 s unless cancelled
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(0.2, connection.gone.set)
        with pytest.raises(ClientLeft):
            # noticed while the work still ran: well inside its 10 s, not when it ended
            await asyncio.wait_for(unless_client_leaves(connection.receive, work()), 5)
        assert work.cancelled
        assert task.cancelling() == 0  # the request's task goes on: it can still answer
        await asyncio.sleep(0.01)

    asyncio.run(main())


def test_a_client_gone_before_the_watch_starts_is_noticed_when_it_does() -> None:
    async def main() -> None:
        connection = Connection()
        connection.gone.set()
        work = SlowWork()
        with pytest.raises(ClientLeft):
            await asyncio.wait_for(unless_client_leaves(connection.receive, work()), 2)
        assert work.cancelled

    asyncio.run(main())


def test_the_servers_own_cancel_still_propagates() -> None:
    async def main() -> None:
        connection = Connection()
        work = SlowWork()
        request = asyncio.create_task(unless_client_leaves(connection.receive, work()))
        for _ in range(200):  # until the watcher waits on the connection (2 s at most)
            if connection.num_receives:
                break
            await asyncio.sleep(0.01)
        assert connection.num_receives == 1, "not watched"
        request.cancel()  # shutdown, not the client
        with pytest.raises(asyncio.CancelledError):
            await request
        assert work.cancelled

    asyncio.run(main())


def test_many_requests_share_one_sweeper() -> None:
    async def main() -> None:
        connections = [Connection() for _ in range(50)]
        works = [SlowWork(WATCH_AFTER_S * 3) for _ in connections]
        answers = await asyncio.gather(*(unless_client_leaves(c.receive, w())
                                         for c, w in zip(connections, works, strict=True)))
        assert answers == ["answer"] * 50
        assert all(c.num_receives == 1 for c in connections)

    asyncio.run(main())
