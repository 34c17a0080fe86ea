"""`podium top URL...`: a live terminal view of one or more instances, read from /metrics.

Importing this module stays cheap and, above all, does not import prometheus_client: the
`podium` command registers `top` before `serve` prepares the metrics directory, and
prometheus_client fixes its multiprocess mode at import.
"""

from __future__ import annotations

import argparse
import signal
import time


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


def run(args: argparse.Namespace) -> int:
    """Run the view until q or Ctrl-C (or once, with --once)."""
    if args.interval <= 0:
        raise SystemExit(f"--interval={args.interval} must be positive")
    from rich.console import Console
    from rich.live import Live

    from podium import env
    from podium.top import view
    from podium.top.live import Watcher, keys, wait_for_quit

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
        with (
            keys() as reading_keys,
            Live(console=console, auto_refresh=False, screen=False) as live,
        ):
            hint = " - q to quit" if reading_keys else ""
            while True:
                live.update(view.table(*watcher.poll(), args.interval, hint), refresh=True)
                if wait_for_quit(args.interval, reading_keys):
                    return 0
    except KeyboardInterrupt:
        return 0
