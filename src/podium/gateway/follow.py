"""A gateway process following its control plane: report, get the table, repeat.

Each turn is one long-polled `POST /v1/gateways/sync`. When the control plane cannot be
reached (stopped, killed, restarting) the gateway keeps routing by the last table it was given
and keeps its finished requests for the next report; once a control plane answers again, its
table replaces the old one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

import httpx
import msgspec

from podium.routes.sync import (
    ANSWER_DECODER,
    ENCODER,
    MAX_PER_REPORT,
    ReportingStats,
    SyncReport,
    TableFollower,
    columns,
)
from podium.routes.table import RouteTable

log = logging.getLogger("podium.gateway")
SYNC_PATH = "/v1/gateways/sync"
RETRY_S = 0.5
"""Pause after a failed turn before the next."""


class ControlFollower:
    """Keeps one gateway's route table in step with the control plane at `control_url`."""

    def __init__(self, control_url: str, table: RouteTable, stats: ReportingStats, *,
                 gateway_id: str, http: str = "", api_key: str | None = None,
                 timeout_s: float = 10.0,
                 held: Callable[[], dict[str, dict[str, int]]] | None = None) -> None:
        self.url = control_url.rstrip("/") + SYNC_PATH
        self.follower = TableFollower(table)
        self.table = table
        self.stats = stats
        self.gateway_id = gateway_id
        self.http = http
        self.headers = {"content-type": "application/json",
                        **({"authorization": f"Bearer {api_key}"} if api_key else {})}
        self.timeout_s = timeout_s
        self.held = held
        """Requests held per model and version (`gateway.hold`), reported as demand."""
        self.num_synced = 0
        self.batch = MAX_PER_REPORT
        """Outcomes per report; halved while the control API finds reports too large."""
        self._reachable = True

    async def run(self) -> None:
        """Follow forever (run as a task; cancel to stop)."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            while True:
                if not await self.turn(client):
                    await asyncio.sleep(RETRY_S)

    async def turn(self, client: httpx.AsyncClient) -> bool:
        """One report and answer; False when the control plane could not be reached."""
        taken = self.stats.take(self.batch)
        report = SyncReport(
            gateway_id=self.gateway_id, epoch=self.follower.epoch,
            generation=self.follower.generation, pid=os.getpid(), http=self.http,
            in_flight={e.id: e.num_in_flight for e in self.table.endpoints()},
            outcomes=columns(taken), held=self.held() if self.held is not None else {})
        try:
            response = await client.post(self.url, content=ENCODER.encode(report),
                                         headers=self.headers)
            if response.status_code == 413 and self.batch > 1:  # its --api-max-body-bytes
                self.batch = max(1, self.batch // 2)
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
            answer = ANSWER_DECODER.decode(response.content)
        except (httpx.HTTPError, RuntimeError, msgspec.DecodeError) as exc:
            self.stats.put_back(taken)
            self.follower.take_elsewhere({})  # unknown now: this gateway's own count only
            if self._reachable and not self.follower.epoch:  # starting beside it
                log.info("waiting for the control plane at %s (%s)", self.url, exc)
            elif self._reachable:  # said once per outage, not every half second
                log.warning("control plane at %s unreachable (%s); serving on the last route "
                            "table (generation %d)", self.url, exc, self.follower.generation)
            self._reachable = False
            return False
        if not self._reachable:
            log.info("control plane at %s answers", self.url)
        self._reachable = True
        if self.follower.apply(answer):
            self.num_synced += 1
        return True
