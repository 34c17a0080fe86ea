"""The control API's gateway routes: `POST /v1/gateways/sync` (a gateway's turn), `GET
/v1/gateways` (who fronts the instances, and with which table) and `GET /metrics` (the
gateways' `podium:gateway_*` metrics, summed over all of them)."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from podium.control.gateway_feed import RouteFeed
from podium.errors import InvalidArgument
from podium.gateway.metrics import CONTENT_TYPE as METRICS_TYPE
from podium.gateway.metrics import render as render_metrics
from podium.routes.sync import ENCODER, REPORT_DECODER

SYNC_PATH = "/v1/gateways/sync"
WAIT_S = 0.25
"""Longest a sync waits for a change: a gateway reports at least this often."""


class QuietSync(logging.Filter):
    """Keeps the gateways' sync turns (several a second each) out of the access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return SYNC_PATH not in record.getMessage()


def add_gateway_routes(app: FastAPI, feed: RouteFeed, *, wait_s: float = WAIT_S,
                       prefix: str = "") -> None:
    """Serve the gateways' sync and list routes on the control API `app` (under `prefix`, e.g.
    `/regions/eu`, for one region's gateways: they follow `--control API/regions/eu`)."""

    @app.post(prefix + SYNC_PATH, include_in_schema=False)
    async def sync(request: Request) -> Response:
        try:
            report = REPORT_DECODER.decode(await request.body())
        except msgspec.DecodeError as exc:
            raise InvalidArgument(f"not a gateway sync report: {exc}; this route is for "
                                  "`podium gateway` processes", param="body") from None
        # the long poll blocks a worker thread, never the event loop
        answer = await run_in_threadpool(feed.sync, report, wait_s=wait_s)
        return Response(ENCODER.encode(answer), media_type="application/json")

    @app.get(prefix + "/v1/gateways")
    def gateways() -> list[dict[str, Any]]:
        """Gateway processes heard from, and whether each routes by the current table."""
        return feed.gateways()

    @app.get(prefix + "/metrics", include_in_schema=False)
    def metrics() -> Response:
        # every gateway's traffic summed (the shared gateway port answers from one of them)
        return Response(render_metrics(feed.table, feed.stats), media_type=METRICS_TYPE)
