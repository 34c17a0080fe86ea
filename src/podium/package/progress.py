"""Progress output for long steps (hashing, copying, converting), quiet when not a terminal."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("podium.package")


class Progress:
    """A rich progress bar on a terminal, a log line per step otherwise."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        if not self.enabled:
            log.info("%s ...", description)
            yield lambda n: None
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as RichProgress

        columns = [TextColumn("{task.description}"), BarColumn()]
        if total:
            columns += [DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
        with RichProgress(*columns, transient=False) as bar:
            task_id = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task_id, n)
            bar.update(task_id, completed=total or 1, total=total or 1)
