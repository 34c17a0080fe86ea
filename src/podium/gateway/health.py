"""Active health checks: probe each endpoint's readiness and route only to ready ones."""

from __future__ import annotations

import asyncio

import httpx

from podium.routes.table import RouteTable


async def check_once(table: RouteTable, client: httpx.AsyncClient, *,
                     path: str = "/health/ready") -> None:
    """Probe every endpoint once; a 200 marks it healthy, anything else unhealthy."""
    endpoints = table.endpoints()

    async def probe(url: str) -> bool:
        try:
            return (await client.get(url + path)).status_code == 200
        except httpx.HTTPError:
            return False

    results = await asyncio.gather(*(probe(e.url) for e in endpoints))
    for endpoint, healthy in zip(endpoints, results, strict=True):
        endpoint.healthy = healthy


async def run_health_checks(table: RouteTable, *, interval_s: float = 1.0,
                            timeout_s: float = 2.0, credential: str | None = None) -> None:
    """Probe forever (run as a task; cancel to stop), sending the instances' `credential`."""
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as client:
        while True:
            await check_once(table, client)
            await asyncio.sleep(interval_s)
