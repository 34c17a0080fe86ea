"""A trickle or a burst of chat requests through a gateway, every answer recorded, and the
gateway's count of requests it held for a version at zero (tests/control/test_e2e_llm.py's scale
to zero)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx


@dataclass
class Sent:
    started: float
    status: int = 0
    retry_after: str | None = None
    body: str = ""
    answered: float = 0.0


def _send(url: str, request: dict, record: Sent) -> None:
    """One chat request, its answer (or the error that took its place: status 0) recorded."""
    try:
        r = httpx.post(url + "/v1/chat/completions", json={**request, "max_tokens": 4},
                       timeout=300)
        record.status, record.body = r.status_code, r.text[:300]
        record.retry_after = r.headers.get("retry-after")
    except httpx.HTTPError as exc:
        record.body = repr(exc)
    record.answered = time.monotonic()


def burst(url: str, request: dict, num: int) -> list[Sent]:
    """`num` chat requests at once, each in its own thread; every answer recorded."""
    sent = [Sent(time.monotonic()) for _ in range(num)]
    threads = [threading.Thread(target=_send, args=(url, request, record), daemon=True)
               for record in sent]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(310)
    return sent


def trickle(url: str, request: dict, stop: threading.Event, every_s: float = 0.5) -> list[Sent]:
    """One chat request every `every_s` until `stop`, each in its own thread (a held one
    waits without holding back the next); every answer recorded."""
    sent: list[Sent] = []

    def send(record: Sent) -> None:
        _send(url, request, record)

    threads = []
    while not stop.is_set():
        record = Sent(time.monotonic())
        sent.append(record)
        threads.append(threading.Thread(target=send, args=(record,), daemon=True))
        threads[-1].start()
        stop.wait(every_s)
    for thread in threads:
        thread.join(310)
    return sent


def cold_start_waits(gateway: str) -> float:
    """Requests the gateway held for a version at zero that then went on (its /metrics)."""
    for line in httpx.get(gateway + "/metrics", timeout=10).text.splitlines():
        if line.startswith("podium:gateway_cold_start_wait_seconds_count") and \
                'version="1"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
