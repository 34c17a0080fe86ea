"""The local runtime with a zygote (`podium.preload.zygote`; it imports `json` here, not vLLM):
the first instance waits for the zygote's import and forks from it, as later ones do; they
boot, serve and are routed; a restarted control plane adopts them (their title names their
port); a zygote that crashed is restarted with a warning and never fails an instance's start.
The deferral's cases: tests/control/test_local_zygote_wait.py."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import httpx
import pytest

from podium.control.runtime.base import READY
from podium.control.runtime.local import LocalRuntime
from podium.preload.spawn import Zygote
from tests.support.local_runtime_env import Env, env, fake_command, wait_for

__all__ = ["env"]  # the fixture, shared through tests/support


def runtime_with_zygote(env: Env) -> LocalRuntime:
    runtime = LocalRuntime(env.store, env.table, env.tmp / "work", command=fake_command,
                           zygote=Zygote(env.tmp / "work", modules=["json"]),
                           zygote_backends=("python",))
    env.runtimes.append(runtime)
    return runtime


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_instances_fork_from_the_zygote_the_first_after_its_import(env: Env) -> None:
    env.package("1")
    runtime = runtime_with_zygote(env)
    zygote = runtime.zygote
    assert zygote is not None and zygote.process is not None  # started with the runtime
    runtime.scale("iris", "1", 1)  # deferred while the zygote imports: no process yet
    wait_for(lambda: runtime.instances()[0].state == READY, runtime)
    first = runtime.instances()[0].pid
    assert first is not None and _parent(first) == zygote.process.pid
    runtime.scale("iris", "1", 2)
    wait_for(lambda: all(i.state == READY for i in runtime.instances()), runtime)
    second = next(i for i in runtime.instances() if i.pid != first)
    assert second.pid is not None and _parent(second.pid) == zygote.process.pid
    assert httpx.get(f"{second.url}/health/ready").json()["pid"] == second.pid
    assert env.table.models() == {"iris": ["1"]}
    notes = [e.message for e in env.store.list_events("iris") if e.kind == "instance"]
    assert sum(f"forked from the zygote (pid {zygote.process.pid}" in m for m in notes) == 2

    env.runtimes.remove(runtime)  # "kill -9" of the plane: a new one adopts both
    adopting = env.runtime()
    assert sorted(i.pid for i in adopting.instances()) == sorted([first, second.pid])
    zygote.stop()


def test_a_crashed_zygote_is_restarted_and_the_instance_starts_anyway(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env.package("1")
    runtime = runtime_with_zygote(env)
    zygote = runtime.zygote
    assert zygote is not None  # started with the runtime (its store deploys "iris")
    wait_for(zygote.ready, runtime)
    os.kill(zygote.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
    wait_for(lambda: not zygote.alive(), runtime)
    with caplog.at_level(logging.WARNING, logger="podium.preload"):
        runtime.scale("iris", "1", 1)
    assert "exited" in caplog.text and "it is restarted" in caplog.text
    wait_for(lambda: runtime.instances()[0].state == READY, runtime)
    assert _parent(runtime.instances()[0].pid) == os.getpid()  # type: ignore[arg-type]
    wait_for(zygote.ready, runtime)  # restarted for the next one
