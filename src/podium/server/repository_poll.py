"""The poll loop of `--model-control-mode poll`: after boot, one `RepositoryPoller.poll_once`
every `--repository-poll-secs` until the instance stops. A poll that fails is logged and
the next one tries again; the instance keeps serving what it has."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from podium.repository.poll import RepositoryPoller
from podium.server.instance import Instance

log = logging.getLogger("podium.repository.poll")


async def poll_forever(instance: Instance, server: Any, interval_s: float) -> None:
    poller = RepositoryPoller(instance.repository)
    while not server.should_exit:
        await asyncio.sleep(interval_s)
        if server.should_exit or instance.draining:
            return
        try:
            await poller.poll_once()
        except Exception:  # a folder mid-copy, a file removed while read: next poll
            log.exception("poll of %s failed; polling again in %gs", poller.root, interval_s)
