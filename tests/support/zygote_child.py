"""Run in a process forked from a zygote (`podium.preload.zygote`) by tests/preload/test_zygote.py:
`python tests/support/zygote_child.py OUT [preloader]` writes what the process has (its
environment, session, niceness, threads, title) to OUT as JSON; with `preloader`, it also
starts a child through its engine preloader (forked from the zygote) and adds that child's
report under "engine"; with `metrics`, it writes metrics made in the zygote and here, then reads
its multiprocess directory back as /metrics does (under "metrics"); with `exit N`, it then exits
with N."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path


def report() -> dict:
    values = sys.modules.get("prometheus_client.values")
    return {"env": dict(os.environ), "pid": os.getpid(), "ppid": os.getppid(),
            "sid": os.getsid(0), "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "threads": len(os.listdir("/proc/self/task")),
            "frozen": gc.get_freeze_count(),
            "cmdline": Path("/proc/self/cmdline").read_bytes().decode(errors="replace"),
            "multiprocess_metrics": bool(values and getattr(values.ValueClass,
                                                            "_multiprocess", False))}


def metric_files() -> list[str]:
    """Where a metric made here is stored (prometheus_client's multiprocess files)."""
    from prometheus_client import Counter

    Counter("zygote_child_runs", "runs of this script").inc()
    return sorted(os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"]))


def metrics_read_back() -> dict:
    """Values made in the zygote (`zygote_metrics`, imported there) and values made here, written
    in turns, each turn adding a key to the one file, then the directory read back as an
    instance's /metrics reads it: the text, or the error reading it."""
    preloaded = "tests.support.zygote_metrics" in sys.modules
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    from tests.support import zygote_metrics

    zygote_metrics.LABELLED.labels("200").inc()  # made here: its file is opened first
    zygote_metrics.MADE_AT_IMPORT.inc()  # made in the zygote: moves to this process's file
    for code in range(300, 320):
        zygote_metrics.LABELLED.labels(str(code)).inc()
    zygote_metrics.MADE_AT_IMPORT.inc()
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    try:
        return {"preloaded": preloaded, "text": generate_latest(registry).decode()}
    except Exception as exc:  # what an instance's /metrics answered with a 500
        return {"preloaded": preloaded, "error": repr(exc)}


def write_report(path: str) -> None:
    _write(Path(path), report())


def _write(path: Path, found: dict) -> None:
    """Whole or not at all: a test waits for the file to exist, then reads it (written in
    place, it was seen empty between its creation and its write)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(found))
    os.replace(part, path)


def main() -> None:
    out = sys.argv[1]
    found = report()
    found["metric_files"] = metric_files()
    if sys.argv[2:] == ["metrics"]:
        found["metrics"] = metrics_read_back()
    if sys.argv[2:] == ["preloader"]:
        from podium.preload import process, server
        from podium.preload.environment import engine_env

        os.environ.update(engine_env(os.environ))  # what vLLM's CPU platform sets
        found["preloader"] = server.start()
        found["preloader_pid"] = server.pid()
        engine = Path(out).with_suffix(".engine.json")
        from tests.support.zygote_child import write_report as target  # importable by name

        proc = process.PreloadedContext().Process(target=target, args=(str(engine),))
        proc.start()
        proc.join(60)
        found["engine"] = json.loads(engine.read_text())
        found["preloader_title"] = Path(f"/proc/{server.pid()}/cmdline").read_text()
        server.stop()
    _write(Path(out), found)
    if sys.argv[2:3] == ["exit"]:
        sys.exit(int(sys.argv[3]))


if __name__ == "__main__":
    main()
