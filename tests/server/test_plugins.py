"""Plugins declared through Python entry points are loaded at boot; a broken one stops boot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from podium.errors import BootError
from podium.server.plugins import load_plugins


def _install_plugin(root: Path, module: str, body: str) -> None:
    (root / f"{module}.py").write_text(body)
    dist = root / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[podium.plugins]\n{module} = {module}:setup\n")


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_entry_point_plugin_runs_at_boot(plugin_path: Path) -> None:
    _install_plugin(plugin_path, "podium_demo_plugin",
                    "CALLS = []\ndef setup():\n    CALLS.append('booted')\n")
    loaded = load_plugins()
    assert "podium.plugins:podium_demo_plugin" in loaded
    assert sys.modules["podium_demo_plugin"].CALLS == ["booted"]


def test_failing_plugin_stops_boot_naming_it(plugin_path: Path) -> None:
    _install_plugin(plugin_path, "podium_broken_plugin",
                    "def setup():\n    raise RuntimeError('no licence file')\n")
    with pytest.raises(BootError, match=r"podium_broken_plugin.*no licence file"):
        load_plugins()
