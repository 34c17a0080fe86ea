"""The control-plane CLI against a live API: exit codes and messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from podium.control.api import create_app
from podium.control.plane import ControlPlane
from podium.control.store import Store
from podium.errors import InvalidArgument
from tests.support.control_cli import podium
from tests.support.fake_world import FakeWorld
from tests.support.servers import Served, closed_port_url


@pytest.fixture
def api(tmp_path: Path) -> Iterator[str]:
    world = FakeWorld()
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    plane = ControlPlane(store, world, clock=lambda: world.now_ms, materialize=lambda _p: None)
    served = Served(create_app(plane))
    yield served.url
    served.stop()
    store.close()


def _package(root: Path, version: str) -> Path:
    folder = root / f"iris-{version}"
    folder.mkdir()
    (folder / "podium.json").write_text(json.dumps(
        {"name": "iris", "version": version, "backend": "python"}))
    return folder


def test_announce_deploy_status_and_rollouts(api: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert podium("announce", str(_package(tmp_path, "1")), "--api", api) == 0
    assert podium("deploy", "iris@1", "--stages", "100", "--api", api) == 0
    assert "#1 iris - -> 1 red-black running" in capsys.readouterr().out
    assert podium("status", "--api", api) == 0
    out = capsys.readouterr().out
    assert "iris" in out and "@1" in out
    assert podium("rollouts", "iris", "--api", api, "--json") == 0
    assert json.loads(capsys.readouterr().out)[0]["to_version"] == "1"
    assert podium("scale", "iris@1", "--min", "1", "--max", "3", "--api", api, "--json") == 0
    assert json.loads(capsys.readouterr().out)["max_instances"] == 3


@pytest.mark.parametrize(("argv", "message"), [
    (("deploy", "iris"), "must be MODEL@VERSION"),
    (("deploy", "iris@9"), "iris@9 is not announced"),
    (("deploy", "iris@1", "--stages", "10,x"), "--stages='10,x' must be integers"),
    (("deploy", "iris@1", "--stages", "50,10,100"), "must be increasing"),
    (("deploy", "iris@1", "--instances", "99"), "num_instances=99 is out of range"),
    (("rollback", "ghost"), "has no deployment"),
    (("scale", "iris@1", "--min", "1", "--max", "99"), "max_instances=99 is out of range"),
    (("scale", "iris@7", "--min", "1", "--max", "2"), "no deployment of iris@7"),
], ids=["no-version", "unknown-version", "stages-not-numbers", "stages-decreasing",
        "too-many-instances", "rollback-unknown", "scale-out-of-range", "scale-unknown"])
def test_bad_input_exits_2_with_the_api_message(
        api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
        message: str) -> None:
    assert podium("announce", str(_package(tmp_path, "1")), "--api", api) == 0
    capsys.readouterr()
    assert podium(*argv, "--api", api) == 2
    assert message in capsys.readouterr().err
    assert podium("rollouts", "--api", api, "--json") == 0
    assert json.loads(capsys.readouterr().out) == []  # nothing was started


def test_events_table_and_json_newest_first(api: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # rich sizes the table to the terminal
    assert podium("announce", str(_package(tmp_path, "1")), "--api", api) == 0
    assert podium("deploy", "iris@1", "--stages", "100", "--api", api) == 0
    capsys.readouterr()
    assert podium("events", "iris", "--api", api) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "time", "(UTC)", "kind", "model", "message"]
    rows = [line for line in lines[2:] if line.strip()]
    assert [r.split()[3] for r in rows] == ["rollout.wait_ready", "rollout", "announce"]
    assert "rollout 1: starting 1 instance(s) of iris@1" in rows[0]
    assert "announced iris@1 (python)" in rows[2]
    assert podium("events", "--limit", "1", "--api", api, "--json") == 0
    [newest] = json.loads(capsys.readouterr().out)
    assert (newest["kind"], newest["model"]) == ("rollout.wait_ready", "iris")
    # the page after the newest event starts with the one before it
    assert podium("events", "--before", str(newest["id"]), "--api", api, "--json") == 0
    assert [e["kind"] for e in json.loads(capsys.readouterr().out)] == ["rollout", "announce"]
    assert podium("events", "ghost", "--api", api) == 0
    assert capsys.readouterr().out.strip() == "no events"
    assert podium("events", "--limit", "0", "--api", api) == 2
    assert "limit: Input should be greater than or equal to 1" in capsys.readouterr().err


def test_up_refuses_bad_api_limits_before_starting(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="--api-max-body-bytes 10: Input should be "
                       "greater than or equal to 1024"):
        podium("up", "--api-max-body-bytes", "10")
    with pytest.raises(InvalidArgument, match="--api-max-header-bytes 0: Input should be "
                       "greater than or equal to 1024"):
        podium("up", "--api-max-header-bytes", "0")
    with pytest.raises(InvalidArgument, match="is not a directory"):
        podium("up", "--package-root", str(tmp_path / "missing"))


def test_unreachable_api_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert podium("status", "--api", closed_port_url()) == 1
    assert "is `podium up` running?" in capsys.readouterr().err
