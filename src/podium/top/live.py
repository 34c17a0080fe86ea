"""The machinery behind `podium top`: scraping instances, keyboard, waiting between frames."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator

import httpx

from podium.top import stats
from podium.top.snapshot import Snapshot, scrape


def metrics_url(url: str) -> str:
    """Accept an instance base URL or a full /metrics URL."""
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else f"{url}/metrics"


class Watcher:
    """Scrapes every instance and keeps the previous snapshot of each for rates."""

    def __init__(self, urls: list[str], api_key: str | None, timeout: float) -> None:
        self.urls = [metrics_url(u) for u in urls]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=timeout)
        self.previous: dict[str, Snapshot | None] = dict.fromkeys(self.urls)

    def poll(self) -> tuple[list[tuple[str, stats.Row | stats.AdapterRow | str]],
                            stats.Row | None]:
        """Scrape all instances once: a line each (or an error), one under it per LoRA adapter
        it answered, and, for several, a total."""
        rows: list[tuple[str, stats.Row | stats.AdapterRow | str]] = []
        pairs: list[tuple[Snapshot | None, Snapshot]] = []
        for url in self.urls:
            name = url.removesuffix("/metrics")
            try:
                snap = scrape(self.client, url)
            except (httpx.HTTPError, ValueError) as exc:
                self.previous[url] = None
                rows.append((name, _describe(exc)))
                continue
            pairs.append((self.previous[url], snap))
            rows.append((name, stats.row(self.previous[url], snap)))
            # LoRA adapters under the instance of their base
            rows += [(f"  └ {adapter} (LoRA)", line)
                     for adapter, line in stats.adapter_rows(self.previous[url], snap)]
            self.previous[url] = snap
        total = stats.total(pairs) if len(self.urls) > 1 else None
        return rows, total


def _describe(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        hint = " (pass --api-key or set PODIUM_API_KEY)" if code in (401, 403) else ""
        return f"HTTP {code}{hint}"
    return f"{type(exc).__name__}: {exc}"[:80]


@contextlib.contextmanager
def keys() -> Iterator[bool]:
    """cbreak mode on a terminal stdin so a single 'q' quits; yields whether keys are read."""
    if not sys.stdin.isatty():
        yield False
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def wait_for_quit(seconds: float, keys: bool) -> bool:
    """Sleep up to `seconds`; True if the user pressed q."""
    if not keys:
        time.sleep(seconds)
        return False
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], left)
        if ready and os.read(sys.stdin.fileno(), 1).lower() == b"q":
            return True
    return False
