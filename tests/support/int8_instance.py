"""The int8 package's instance (tests/package/test_precision_real.py, also the suite's
preloader-bypass case), booted in the background from the session's first test when the
session has a test on it (`tests/conftest.py`, `_early_engine_runs`), at nice
`background.NICE`, as the background jobs are (tests/support/background.py): its ~40 s boot
then takes the CPU the first tests leave instead of holding up its module. It idles (memory
only) until its module takes it, and stops when that module is done (or the session ends).

Its preloader is killed as soon as the boot log names it, before the engine starts
(`preloader.start_bypassed`), then the server is reniced: the engine it spawns afterwards
inherits the nice value. Which way, and at what priority, the engine process started does not
change what it computes."""

from __future__ import annotations

from pathlib import Path

import psutil

from tests.support import background
from tests.support.harness import RunningInstance
from tests.support.preloader import start_bypassed

INT8 = "smollm2-int8"

_running: RunningInstance | None = None


def package(workdir: Path) -> Path:
    """The default LLM's package with precision int8, its W8A8 checkpoint in the cache."""
    from podium.package.cache import ModelCache
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import open_package, write_manifest

    written = write_manifest(workdir / INT8,
                             {**default_llm_manifest(), "name": INT8, "precision": "int8"})
    ModelCache().materialize(open_package(written.root))  # as `podium announce` would
    return written.root


def start(workdir: Path) -> RunningInstance:
    """The session's int8 instance, booting (not waited ready): started now, or the one
    already started."""
    global _running
    if _running is None or _running.process.poll() is not None:
        _running = start_bypassed([str(package(workdir))], workdir / "int8.log")
        psutil.Process(_running.process.pid).nice(background.NICE)
    return _running


def stop() -> None:
    global _running
    if _running is not None:
        _running.stop()
        _running = None
