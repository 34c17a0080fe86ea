"""`podium announce` of one model of a Triton repository, through the control API on a fake
world: numbered version folders become versions, each a snapshot an instance serves; refusals
are a 4xx naming the field and leave the store as it was, and the next good request works."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.repository.scan import open_served
from podium.triton.package import TritonPackage
from tests.support.control_api import FAST, Env
from tests.support.triton_layouts import (
    ADD_SUB,
    ADD_SUB_CONFIG,
    ENSEMBLE_CONFIG,
    SCALE,
    SCALE_CONFIG,
    write_model,
)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))  # the snapshots land there
    return Env(tmp_path)


def _announce(env: Env, path: Path) -> tuple[int, dict]:
    r = env.client.post("/v1/packages", json={"path": str(path)})
    return r.status_code, r.json()


def test_each_version_folder_becomes_a_version_served_from_its_snapshot(env: Env) -> None:
    repo = env.tmp / "repo"
    write_model(repo, "add_sub", ADD_SUB_CONFIG + "version_policy { specific { versions: 1 } }",
                ADD_SUB, versions=("1", "2"))
    (repo / "add_sub" / "helpers.py").write_text("X = 1\n")  # beside the versions: copied

    status, body = _announce(env, repo / "add_sub")
    assert status == 201, body
    assert [row["version"] for row in body["announced"]] == ["1", "2"]
    rows = {p.version: p for p in env.store.list_packages()}
    assert sorted(rows) == ["1", "2"] and {p.name for p in rows.values()} == {"add_sub"}
    for version, row in rows.items():
        snapshot = Path(row.location)
        assert snapshot.name == "add_sub" and snapshot.is_relative_to(env.tmp / "home")
        assert sorted(p.name for p in snapshot.iterdir()) == sorted(
            [version, "config.pbtxt", "helpers.py"])  # one version each
        (package,) = open_served(snapshot)  # what `podium serve LOCATION` serves
        assert isinstance(package, TritonPackage) and package.key == f"add_sub@{version}"
        # the announced config serves its one version whatever the repository's policy
        assert not package.config.HasField("version_policy")

    # the user's folder changes after the announce: the snapshot does not
    (repo / "add_sub" / "1" / "model.py").write_text("broken")
    assert "TritonPythonModel" in (Path(rows["1"].location) / "1" / "model.py").read_text()

    r = env.client.post("/v1/rollouts", json={"model": "add_sub", "version": "1", **FAST})
    assert r.status_code == 201, r.text  # deployable like any package


def test_a_new_folder_announces_only_the_new_version(env: Env) -> None:
    repo = env.tmp / "repo"
    write_model(repo, "scale", SCALE_CONFIG, SCALE)
    assert _announce(env, repo / "scale")[0] == 201
    status, body = _announce(env, repo / "scale")
    assert status == 409 and body["error"]["param"] == "version", body
    assert "scale/2" in body["error"]["message"]
    (repo / "scale" / "2").mkdir()
    (repo / "scale" / "2" / "model.py").write_text(SCALE)
    status, body = _announce(env, repo / "scale")
    assert status == 201, body
    assert [r["version"] for r in body["announced"]] == ["2"] and body["skipped"] == ["1"]
    # one version folder named on its own
    (repo / "scale" / "3").mkdir()
    (repo / "scale" / "3" / "model.py").write_text(SCALE)
    status, body = _announce(env, repo / "scale" / "3")
    assert status == 201 and [r["version"] for r in body["announced"]] == ["3"], body


@pytest.mark.parametrize(("name", "config", "param", "words"), [
    ("ens", ENSEMBLE_CONFIG, "platform", "serve the whole repository"),
    ("opt", SCALE_CONFIG + "optimization { cuda { graphs: true } }\n", "optimization",
     "field 'optimization' is not supported"),
    ("gpu", SCALE_CONFIG + "instance_group [ { kind: KIND_GPU } ]\n", "instance_group.kind",
     "KIND_GPU"),
    ("trt", 'backend: "tensorrt"\n', "backend", "tensorrt"),
    ("Upper", SCALE_CONFIG, "name", "name"),
], ids=["ensemble", "unsupported-field", "gpu", "unknown-backend", "bad-name"])
def test_a_model_that_cannot_be_announced_is_a_4xx_naming_the_field(
        env: Env, name: str, config: str, param: str, words: str) -> None:
    repo = env.tmp / "repo"
    write_model(repo, name, config, SCALE)
    write_model(repo, "good", SCALE_CONFIG, SCALE)
    before = env.snapshot()
    status, body = _announce(env, repo / name)
    assert status == 400, body
    assert body["error"]["param"] == param and words in body["error"]["message"], body
    assert env.snapshot() == before
    assert _announce(env, repo / "good")[0] == 201  # the next good request


def test_a_model_without_a_version_folder_is_refused(env: Env) -> None:
    repo = env.tmp / "repo"
    write_model(repo, "empty", SCALE_CONFIG, SCALE, versions=())
    status, body = _announce(env, repo / "empty")
    assert status == 400 and body["error"]["param"] == "version", body
    (repo / "empty" / "1").mkdir()
    (repo / "empty" / "1" / "model.py").write_text(SCALE)
    assert _announce(env, repo / "empty")[0] == 201


def test_podium_announce_of_a_triton_model_on_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from podium.control.api import create_app
    from tests.support.control_cli import podium
    from tests.support.servers import Served

    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    env = Env(tmp_path)
    served = Served(create_app(env.plane))
    try:
        repo = tmp_path / "repo"
        write_model(repo, "scale", SCALE_CONFIG, SCALE, versions=("1", "2"))
        assert podium("announce", str(repo / "scale"), "--api", served.url) == 0
        assert capsys.readouterr().out.strip() == (
            f"announced scale@1, scale@2 from Triton model {repo / 'scale'}")
        assert podium("announce", str(repo / "scale"), "--api", served.url) == 2
        assert "already announced; add a numbered version folder" in capsys.readouterr().err
        write_model(repo, "trt", 'backend: "tensorrt"\n', SCALE)
        assert podium("announce", str(repo / "trt"), "--api", served.url) == 2
        assert "backend='tensorrt'" in capsys.readouterr().err
        assert podium("deploy", "scale@2", "--api", served.url) == 0
    finally:
        served.stop()
        env.store.close()
