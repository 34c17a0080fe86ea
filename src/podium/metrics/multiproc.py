"""The Prometheus multiprocess directory of one instance: chosen, locked, wiped, exported.

vLLM records every `vllm:*` metric with prometheus_client. When PROMETHEUS_MULTIPROC_DIR is set
before prometheus_client is first imported, every metric value in every process of the instance
(podium's own, vLLM's, anything in a spawned child) is written to `<kind>_<pid>.db` files in that
directory, and `MultiProcessCollector` reads them all back for one `/metrics` response.

prometheus_client picks its value class once, when `prometheus_client.values` is imported, so
`prepare_multiproc_dir` must run before anything imports prometheus_client; it refuses to run
late rather than leave the directory silently empty.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from pathlib import Path

from podium import env

ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"
LOCK_NAME = "instance.lock"
_PREFIX = "instance-"

# The open lock file keeps the directory ours for the life of the process; flock locks die with
# the process, so a crashed instance never blocks a new one.
_held: tuple[Path, int] | None = None


class MultiprocDirError(RuntimeError):
    """The multiprocess directory cannot be set up safely."""


def default_base() -> Path:
    """Parent of every instance's metrics directory on this machine."""
    return env.home() / "run" / "prometheus"


def prepare_multiproc_dir(base: Path | None = None) -> Path:
    """Claim a directory unique to this instance, wipe stale files, export PROMETHEUS_MULTIPROC_DIR.

    Call it first in the boot sequence, before anything imports prometheus_client (podium's
    metrics modules, vLLM). Calling it again in the same process returns the same directory.
    Directories left by dead instances under `base` are removed.
    """
    global _held
    if _held is not None:
        return _held[0]
    _refuse_if_prometheus_loaded()
    base = (base or default_base()).expanduser().resolve()
    base.mkdir(parents=True, exist_ok=True)
    _remove_dead_siblings(base)
    path, fd = _claim(base)
    wipe(path)
    _held = (path, fd)
    os.environ[ENV_VAR] = str(path)
    return path


def wipe(path: Path) -> int:
    """Delete every metric file in `path` (a stale .db would be summed into the new run)."""
    removed = 0
    for entry in path.iterdir():
        if entry.name == LOCK_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed += 1
    return removed


def wipe_foreign() -> int | None:
    """Delete the metric files of every process but this one from this instance's directory:
    boot's step before the engine starts, so the engine's numbers begin at zero whatever ran
    since the directory was claimed (a plugin's helper process). None: no directory in use."""
    path = os.environ.get(ENV_VAR)
    if not path or not Path(path).is_dir():
        return None
    removed = 0
    own = str(os.getpid())
    for entry in Path(path).glob("*.db"):
        # prometheus_client names them `<kind>_<pid>.db`
        if entry.stem.rpartition("_")[2] != own:
            entry.unlink(missing_ok=True)
            removed += 1
    return removed


def mark_process_dead(pid: int | None = None) -> None:
    """Drop a finished process's live gauges (call at shutdown for this process)."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid if pid is not None else os.getpid(), path)


def release() -> None:
    """Unlock and remove this instance's directory (clean shutdown)."""
    global _held
    if _held is None:
        return
    path, fd = _held
    _held = None
    if os.environ.get(ENV_VAR) == str(path):
        del os.environ[ENV_VAR]
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)


def _refuse_if_prometheus_loaded() -> None:
    values = sys.modules.get("prometheus_client.values")
    if values is None or getattr(values.ValueClass, "_multiprocess", False):
        return
    raise MultiprocDirError(
        "prometheus_client was imported before the metrics directory was prepared, so every "
        "metric of this process would stay in memory and vLLM's would never reach /metrics; "
        "call podium.metrics.multiproc.prepare_multiproc_dir() before importing "
        "podium.metrics.server, prometheus_client or vllm."
    )


def _claim(base: Path) -> tuple[Path, int]:
    # Named after the pid for operators; the lock, not the name, is what makes it exclusive
    # (a pid can be reused after a crash).
    pid = os.getpid()
    for attempt in range(100):
        name = f"{_PREFIX}{pid}" if attempt == 0 else f"{_PREFIX}{pid}-{attempt}"
        path = base / name
        path.mkdir(exist_ok=True)
        fd = _try_lock(path)
        if fd is not None:
            return path, fd
    raise MultiprocDirError(f"no free metrics directory under {base} (100 candidates locked)")


def _try_lock(path: Path) -> int | None:
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return None  # another instance's sweep removed it between mkdir and open
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _remove_dead_siblings(base: Path) -> None:
    for entry in base.iterdir():
        if not entry.is_dir() or not entry.name.startswith(_PREFIX):
            continue
        fd = _try_lock(entry)
        if fd is None:
            continue  # a live instance holds it
        try:
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)
