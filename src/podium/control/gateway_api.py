"""The control API's gateway routes: `POST /v1/gateways/sync` (a gateway's turn), `GET
/v1/gateways` (who fronts the instances, and with which table), `GET /v1/traffic` (a model's
requests, errors and p50/p99 latency per version over the last minutes, for the console) and
`GET /metrics` (the gateways' `podium:gateway_*` metrics, summed over all of them)."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

import msgspec
from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from podium.control.gateway_feed import RouteFeed
from podium.errors import InvalidArgument
from podium.gateway.metrics import CONTENT_TYPE as METRICS_TYPE
from podium.gateway.metrics import render as render_metrics
from podium.routes.sync import ENCODER, REPORT_DECODER
from podium.routes.traffic import series

SYNC_PATH = "/v1/gateways/sync"
MAX_BUCKETS = 600
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

    @app.get(prefix + "/v1/traffic")
    def traffic(model: Annotated[str, Query(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$",
                                            description="The model.")],
                span_s: Annotated[int, Query(ge=1, le=3600, description=(
                    "How far back (seconds)."))] = 600,
                step_s: Annotated[int, Query(ge=1, le=3600, description=(
                    "Bucket width (seconds)."))] = 10) -> dict[str, Any]:
        """Per version of `model`: requests, errors, p50 and p99 latency (ms) per bucket over
        the last `span_s`, as the gateways reported them (exact quantiles, not a histogram's)."""
        if span_s / step_s > MAX_BUCKETS:
            raise InvalidArgument(f"span_s={span_s} / step_s={step_s} makes "
                                  f"{-(-span_s // step_s)} buckets; at most {MAX_BUCKETS}: "
                                  "widen step_s", param="step_s")
        now_ms = int(time.time() * 1000)
        return {"model": model, "now_ms": now_ms, "step_ms": step_s * 1000,
                "versions": series(feed.stats, model, now_ms=now_ms, span_ms=span_s * 1000,
                                   step_ms=step_s * 1000)}

    @app.get(prefix + "/metrics", include_in_schema=False)
    def metrics() -> Response:
        # every gateway's traffic summed (the shared gateway port answers from one of them)
        return Response(render_metrics(feed.table, feed.stats), media_type=METRICS_TYPE)
