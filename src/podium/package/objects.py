"""Content-addressed objects of the model cache: how one is written without ever being seen
half-made (a staging folder beside it, renamed into place once complete)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

OBJECT_INFO = "podium-object.json"
"""Written last into an object: present means complete."""


@contextmanager
def staging_for(target: Path) -> Iterator[Path]:
    """A fresh staging folder beside `target`; removed if the block fails."""
    staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def publish(staging: Path, target: Path, info: dict[str, Any]) -> None:
    """Mark `staging` complete with `info` and move it to `target`."""
    (staging / OBJECT_INFO).write_text(json.dumps(info, indent=2))
    promote(staging, target)


def promote(staging: Path, target: Path) -> None:
    """Rename a finished `staging` folder to `target`; a concurrent writer that got there
    first wins (its object is identical) and ours is dropped."""
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
