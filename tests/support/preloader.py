"""The engine preloader of a real `podium serve`, seen from outside: its pid from the boot
log, the engine core it forked (or the server spawned), and an instance whose preloader is
killed before the engine starts (the bypass: spawned the usual way, with a warning)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil

from tests.support.harness import RunningInstance, start_instance

PRELOADER = re.compile(r"boot step start preloader took [0-9.]+s \(pid (\d+),")


def preloader_pid(log: str) -> int:
    found = PRELOADER.search(log)
    assert found, "no preloader in the boot log"
    return int(found.group(1))


def engine_processes(parent: int) -> tuple[psutil.Process, list[psutil.Process]]:
    """The first engine core among `parent`'s children (a forked engine core keeps the
    preloader's process name, a spawned one is named by vLLM; either has its worker, spawned
    or forked, as its child; the server's and the preloader's other children have none)."""
    children = psutil.Process(parent).children()
    cores = [c for c in children if c.name().startswith("VLLM::EngineCore")
             or any(w.name().startswith("VLLM::Worker") for w in c.children())
             or c.children()]
    assert len(cores) >= 1, [c.name() for c in children]
    return cores[0], cores[0].children()


def start_bypassed(args: list[str], log_path: Path, **kwargs) -> RunningInstance:
    """`podium serve` whose preloader is killed (SIGKILL) as soon as the boot log names it,
    while the engine check is still importing vLLM: the instance must boot without it. Not
    waited ready."""
    instance = start_instance(args, log_path, **kwargs)
    try:
        deadline = time.monotonic() + 300
        while not PRELOADER.search(instance.log()):
            assert time.monotonic() < deadline and instance.process.poll() is None, \
                instance.log()[-3000:]
            time.sleep(0.05)  # polling the log file: the line appears within a second or two
        os.kill(preloader_pid(instance.log()), signal.SIGKILL)
    except BaseException:
        instance.stop()
        raise
    return instance


def assert_bypassed(instance: RunningInstance) -> None:
    """The boot of `start_bypassed`: the engine started after the warning, spawned by the
    server itself."""
    log = instance.log()
    assert "start engine" in log.split("engine preloader bypassed", 1)[0]
    assert "engine preloader bypassed: it (pid" in log
    core, _ = engine_processes(instance.process.pid)
    assert core.ppid() == instance.process.pid  # spawned the usual way
