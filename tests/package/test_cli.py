"""`podium package`, `podium inspect`, `podium schema`: the packaging commands end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import hostile as h

PODIUM = [sys.executable, "-m", "podium.cli"]


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PODIUM, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def _package_dir(tmp_path: Path, manifest: dict) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "podium.json").write_text(json.dumps(manifest))
    (src / "model.py").write_text("class Model: ...\n")
    return src


def test_package_then_inspect(tmp_path: Path) -> None:
    src = _package_dir(tmp_path, {"name": "pyex", "version": "2", "backend": "python"})
    out = tmp_path / "pyex.tar.gz"
    result = _run("package", str(src), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "pyex@2" in result.stdout and out.is_file()
    shown = _run("inspect", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["manifest"]["name"] == "pyex" and "model.py" in data["files"]


def test_package_rejects_missing_file(tmp_path: Path) -> None:
    src = _package_dir(tmp_path, {"name": "pyex", "backend": "python", "module": "nope.py"})
    result = _run("package", str(src), "-o", str(tmp_path / "x.tar.gz"))
    assert result.returncode == 2
    assert "nope.py" in result.stderr


def test_package_rejects_other_engine_version(tmp_path: Path) -> None:
    src = _package_dir(tmp_path, {"name": "llm", "backend": "vllm", "engine_version": "0.5.0",
                                  "weights": {"source": "package", "path": "model.py"}})
    result = _run("package", str(src), "-o", str(tmp_path / "x.tar.gz"))
    assert result.returncode == 2
    assert "0.5.0" in result.stderr and "0.32.0" in result.stderr


def test_schema_command_prints_json_schema() -> None:
    result = _run("schema")
    assert result.returncode == 0
    assert json.loads(result.stdout)["title"].startswith("Podium package manifest")


@pytest.mark.parametrize(("build", "command", "expected"), [
    pytest.param(h.manifest_is_fifo, "inspect", "podium.json is a FIFO",
                 id="inspect-fifo-manifest"),
    pytest.param(h.archive_gzip_bomb, "inspect", "times its compressed size", id="inspect-bomb"),
    pytest.param(h.fifo_in_package, "package", "'data/pipe' is a FIFO", id="package-fifo"),
    pytest.param(h.manifest_nested_100000, "package", "nested too deeply", id="package-deep"),
])
def test_a_real_process_refuses_in_one_line_then_packages(
        tmp_path: Path, build: h.Builder, command: str, expected: str) -> None:
    layout = h.Layout(tmp_path).create()
    env = {**os.environ, "PODIUM_HOME": str(layout.home)}
    args = [command, str(build(layout))]
    args += ["-o", str(layout.out / "bad.tar.gz")] if command == "package" else []
    refused = subprocess.run([*PODIUM, *args], capture_output=True, text=True, timeout=60,
                             env=env)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and expected in refused.stderr, refused.stderr
    assert (layout.out / "bad.tar.gz").read_bytes().startswith(b"a previous archive")
    assert not list(layout.root.rglob("*.partial*"))
    good = subprocess.run([*PODIUM, "package", str(layout.good), "-o",
                           str(layout.out / "good.tar.gz")], capture_output=True, text=True,
                          timeout=60, env=env)
    assert good.returncode == 0, good.stderr


@pytest.mark.parametrize(("catalog", "data", "expected"), [
    ("../outside.txt", b"ok\n", "constraint_catalog='../outside.txt'"),
    ("catalog.txt", b"Amelie\nLa Haine\n\xe9t\xe9\n", "line 3 is not UTF-8 (byte 0xe9)"),
    ("catalog.txt", b"\n\n", "holds no string"),
], ids=["leaves", "not-utf8", "empty"])
def test_package_refuses_a_bad_constraint_catalog_then_packages_a_good_one(
        tmp_path: Path, catalog: str, data: bytes, expected: str) -> None:
    manifest = {"name": "llm", "backend": "vllm", "constraint_catalog": catalog,
                "weights": {"source": "package", "path": "model.py"}}
    src = _package_dir(tmp_path, manifest)
    (src / catalog).write_bytes(data)
    refused = _run("package", str(src), "-o", str(tmp_path / "x.tar.gz"))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and expected in refused.stderr, refused.stderr
    (src / "podium.json").write_text(json.dumps({**manifest, "constraint_catalog": "good.txt"}))
    (src / "good.txt").write_text("Amélie\nLa Haine\n")
    packaged = _run("package", str(src), "-o", str(tmp_path / "x.tar.gz"))
    assert packaged.returncode == 0, packaged.stderr
