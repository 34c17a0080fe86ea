"""The local runtime's first instance and the zygote's import (a fake zygote whose state the
test sets; what it "forks" is a plain tiny server): the zygote starts early (the runtime
starts with a deployment of its backend in the store, or one is scaled), a launch that finds
it importing is deferred (the instance stays starting, its event says why, nothing waits in
the plane's loop) and forked at the pass that finds it ready; plain with the reason in its
event when the bound passes or the zygote exits meanwhile; a deferred instance scaled away
never starts."""

from __future__ import annotations

import sys
from typing import IO, Any

from podium.control.runtime.base import READY, STARTING
from podium.control.runtime.detached import spawn_gated
from podium.control.runtime.local import LocalRuntime
from tests.support.local_runtime_env import Env, env, fake_command, wait_for

__all__ = ["env"]  # the fixture, shared through tests/support


class _Process:
    def __init__(self, pid: int, returncode: int | None = None) -> None:
        self.pid, self.returncode = pid, returncode


class FakeZygote:
    """`preload.spawn.Zygote`'s surface; `state` is "importing", "ready" or "exited"."""

    def __init__(self) -> None:
        self.state = "importing"
        self.process: _Process | None = None
        self.starts = 0
        self.forked: list[int] = []

    def start(self) -> None:
        self.starts += 1
        self.process, self.state = _Process(40_000 + self.starts), "importing"

    def exit(self) -> None:
        assert self.process is not None
        self.process.returncode, self.state = -9, "exited"

    def alive(self) -> bool:
        return self.process is not None and self.state != "exited"

    def ready(self) -> bool:
        return self.alive() and self.state == "ready"

    def importing(self) -> bool:
        return self.alive() and self.state == "importing"

    def fork(self, argv: list[str], *, out: IO[bytes], env: dict[str, str],
             nice: int = 0) -> tuple[Any, str]:
        if self.state == "exited":
            self.start()
            return None, "the zygote (pid 1) exited (-9); it is restarted"
        if self.state != "ready":
            return None, "the zygote is still importing the engine"
        process = spawn_gated([sys.executable, *argv], out=out, env=env)
        self.forked.append(process.pid)
        return process, ""

    def stop(self) -> None:
        self.process = None


def runtime(env: Env, zygote: FakeZygote, **kwargs: Any) -> LocalRuntime:
    kwargs.setdefault("zygote_backends", ("python",))
    made = LocalRuntime(env.store, env.table, env.tmp / "work", command=fake_command,
                        zygote=zygote, **kwargs)  # type: ignore[arg-type]
    env.runtimes.append(made)
    return made


def events(env: Env) -> list[str]:
    return [e.message.split(": ", 1)[1] for e in reversed(env.store.list_events("iris"))
            if e.kind == "instance"]


def test_the_zygote_starts_with_a_runtime_whose_store_deploys_its_backend(env: Env) -> None:
    env.package("1")  # deployed (active): a plane restarted with it
    zygote = FakeZygote()
    runtime(env, zygote)
    assert zygote.starts == 1
    idle = FakeZygote()
    runtime(env, idle, zygote_backends=("vllm",))  # nothing of its backend: no engine import
    assert idle.starts == 0


def test_an_instance_waits_for_the_zygote_importing_then_forks_from_it(env: Env) -> None:
    env.package("1")
    zygote = FakeZygote()
    local = runtime(env, zygote)
    local.scale("iris", "1", 1)
    [waiting] = local.instances()
    assert (waiting.state, waiting.pid, zygote.starts) == (STARTING, None, 1)
    assert events(env) == ["waits for the zygote's import (at most 60 s), then forks from it"]
    for _ in range(3):
        local.poll()  # still importing: nothing started, no crash counted
    assert local.instances()[0].pid is None and local.num_crashes("iris", "1") == 0

    zygote.state = "ready"
    local.poll()
    [forked] = local.instances()
    assert forked.pid is not None and zygote.forked == [forked.pid]
    assert events(env)[-1].startswith("forked from the zygote (pid 40001, after waiting ")
    wait_for(lambda: local.instances()[0].state == READY, local)
    assert env.table.models() == {"iris": ["1"]}


def test_a_ready_zygote_forks_the_instance_at_once(env: Env) -> None:
    env.package("1")
    zygote = FakeZygote()
    local = runtime(env, zygote)
    zygote.state = "ready"
    local.scale("iris", "1", 1)
    [forked] = local.instances()
    assert forked.pid is not None and zygote.forked == [forked.pid]
    assert events(env) == ["forked from the zygote (pid 40001)"]


def test_past_the_bound_the_instance_starts_plain_saying_why(env: Env) -> None:
    env.package("1")
    zygote = FakeZygote()
    local = runtime(env, zygote, zygote_wait_s=0)
    local.scale("iris", "1", 1)
    assert local.instances()[0].pid is None
    local.poll()  # the bound passed: plain, though the zygote still imports
    assert local.instances()[0].pid is not None and zygote.forked == []
    assert events(env)[-1].startswith("started as a plain process: the zygote was still "
                                      "importing the engine after 0 s (the bound: 0 s)")
    wait_for(lambda: local.instances()[0].state == READY, local)


def test_a_zygote_that_exits_while_an_instance_waits_leaves_it_plain(env: Env) -> None:
    env.package("1")
    zygote = FakeZygote()
    local = runtime(env, zygote)
    local.scale("iris", "1", 1)
    zygote.exit()
    local.poll()
    [plain] = local.instances()
    assert plain.pid is not None and zygote.forked == []
    assert events(env)[-1] == ("started as a plain process: the zygote (pid 1) exited (-9); it "
                               "is restarted")
    assert zygote.starts == 2  # restarted for the next instances
    wait_for(lambda: local.instances()[0].state == READY, local)
    assert local.num_crashes("iris", "1") == 0


def test_a_zygote_restarted_meanwhile_is_not_waited_for_again(env: Env) -> None:
    env.package("1")
    zygote = FakeZygote()
    local = runtime(env, zygote)
    local.scale("iris", "1", 1)
    zygote.start()  # exited and restarted (by another launch): importing again
    local.poll()
    assert local.instances()[0].pid is not None and zygote.forked == []
    assert events(env)[-1] == ("started as a plain process: the zygote exited and was "
                               "restarted while this instance waited for it")


def test_a_waiting_instance_scaled_away_never_starts(env: Env) -> None:
    env.package("1")
    zygote = FakeZygote()
    local = runtime(env, zygote)
    local.scale("iris", "1", 1)
    local.scale("iris", "1", 0)
    zygote.state = "ready"
    wait_for(lambda: local.instances() == [], local)
    assert zygote.forked == [] and local.num_crashes("iris", "1") == 0
    [(_, _, row)] = env.store.list_instances("iris", include_stopped=True)
    assert (row.state, row.pid) == ("stopped", None)


def test_scaling_a_deployment_of_its_backend_starts_the_zygote(env: Env) -> None:
    zygote = FakeZygote()
    local = runtime(env, zygote)
    assert zygote.starts == 0  # nothing deployed yet
    env.package("1")
    local.scale("iris", "1", 0)  # announced, waiting at zero for its first request
    assert zygote.starts == 1 and local.instances() == []
    local.scale("iris", "1", 0)
    assert zygote.starts == 1
