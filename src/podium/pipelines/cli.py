"""`podium batch PIPELINE --input FILE`: the precomputed path, with a progress bar."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch", help="precompute a pipeline's answers into its result cache")
    p.add_argument("pipeline", help="the pipeline's name")
    p.add_argument("--input", type=Path, required=True,
                   help="JSON lines, one object of the pipeline's inputs per line")
    p.add_argument("--repository", type=Path, default=Path("models"),
                   help="the model repository holding the pipeline and its models (./models)")
    p.add_argument("--batch-size", type=_bounded(1, 100_000), default=64,
                   help="rows per batch; each batch is written to the cache at once (64)")
    p.add_argument("--concurrency", type=_bounded(1, 4096), default=8,
                   help="rows run at once (8; with --ray-address, per Ray actor)")
    p.add_argument("--ray-address", default=None,
                   help="run the rows on this Ray cluster with Ray Data (HOST:PORT of its "
                        "head, or auto); the repository must be at the same path on every "
                        "node. Default: in this process")
    p.add_argument("--ray-actors", type=_bounded(1, 4096), default=2,
                   help="with --ray-address: Ray Data actors, each loading the pipeline (2)")
    p.set_defaults(func=_batch)


def _bounded(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not within {low}..{high}")
        return value
    return parse


def _batch(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from podium.pipelines.batch import run_batch
    from podium.server.logs import configure_logging

    configure_logging()
    with Progress(transient=False) as progress:
        task = progress.add_task(f"batch {args.pipeline}", total=None)

        def show(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        report = asyncio.run(run_batch(args.repository, args.pipeline, args.input,
                                       batch_size=args.batch_size,
                                       concurrency=args.concurrency, on_progress=show,
                                       ray_address=args.ray_address,
                                       ray_actors=args.ray_actors))
    print(f"batch {args.pipeline}: {report.total} rows, {report.skipped} already fresh, "
          f"{report.computed} computed, {report.failed} failed")
    return 1 if report.failed else 0
