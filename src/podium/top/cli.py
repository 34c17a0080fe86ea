"""`podium top URL...`: a live terminal view of one or more instances, read from /metrics."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Iterator

import httpx
from rich.console import Console
from rich.live import Live

from podium import env
from podium.top import stats, view
from podium.top.snapshot import Snapshot, scrape


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `top` subcommand to the `podium` command."""
    parser = subparsers.add_parser(
        "top",
        help="live view of instances' traffic, tokens, TTFT, KV cache and queues",
        description="Watch one or more Podium instances (or vLLM servers) through their /metrics.",
    )
    parser.add_argument(
        "urls",
        nargs="+",
        metavar="URL",
        help="instance base URL or /metrics URL, e.g. http://127.0.0.1:8000",
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between scrapes (default 2)"
    )
    parser.add_argument(
        "--api-key", default=None, help="bearer key for /metrics (default: $PODIUM_API_KEY)"
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="scrape twice, one interval apart, print one table and exit",
    )
    parser.set_defaults(func=run)
    return parser


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

    def poll(self) -> tuple[list[tuple[str, stats.Row | str]], stats.Row | None]:
        """Scrape all instances once: a line each (or an error) and, for several, a total."""
        rows: list[tuple[str, stats.Row | str]] = []
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
def _keys() -> Iterator[bool]:
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


def _wait_for_quit(seconds: float, keys: bool) -> bool:
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


def run(args: argparse.Namespace) -> int:
    """Run the view until q or Ctrl-C (or once, with --once)."""
    if args.interval <= 0:
        raise SystemExit(f"--interval={args.interval} must be positive")
    watcher = Watcher(args.urls, args.api_key or env.api_key(), timeout=max(args.interval, 1.0))
    console = Console()
    if args.once:
        watcher.poll()
        time.sleep(args.interval)
        console.print(view.table(*watcher.poll(), args.interval))
        return 0
    # A launcher running us in the background may leave SIGINT ignored, and Python then never
    # raises KeyboardInterrupt; an interactive view must always stop on Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with _keys() as keys, Live(console=console, auto_refresh=False, screen=False) as live:
            hint = " - q to quit" if keys else ""
            while True:
                live.update(view.table(*watcher.poll(), args.interval, hint), refresh=True)
                if _wait_for_quit(args.interval, keys):
                    return 0
    except KeyboardInterrupt:
        return 0
