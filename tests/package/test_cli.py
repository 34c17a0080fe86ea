"""`podium package`, `podium inspect`, `podium schema`: the packaging commands end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
