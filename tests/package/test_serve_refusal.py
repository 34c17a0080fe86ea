"""`podium serve` and the python backend never import a module from outside the package."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from podium.backends import create_backend
from podium.errors import PackageError
from podium.package.manifest import load_manifest
from podium.package.package import Package
from tests.support import hostile as h
from tests.support.harness import running_instance, start_instance


def test_serve_refuses_a_module_outside_the_package_then_serves_a_good_one(
        tmp_path: Path) -> None:
    layout = h.Layout(tmp_path).create()
    h.module_dot_dot(layout)
    env = {"PODIUM_HOME": str(layout.home)}
    bad = start_instance([str(layout.bad)], tmp_path / "bad.log", env=env)
    try:
        assert bad.process.wait(120) != 0
    finally:
        bad.stop()
    log = bad.log()
    failures = [line for line in log.splitlines() if "boot failed" in line]
    assert len(failures) == 1 and "module='../outside/evil.py'" in failures[0], log
    assert "Traceback" not in log
    assert not layout.marker.exists()
    with running_instance([str(layout.good)], tmp_path / "good.log", env=env) as good:
        response = httpx.post(f"{good.http_url}/v2/models/good/infer", timeout=30, json={
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [21]}]})
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [42.0]


@pytest.mark.parametrize("module", ["../outside/evil.py", "link.py"], ids=["dot-dot", "link"])
def test_python_backend_checks_the_module_path_itself(tmp_path: Path, module: str) -> None:
    """Even handed a Package that skipped open_package's checks, nothing outside is imported."""
    layout = h.Layout(tmp_path).create()
    root = h.write_package(layout.bad, {**h.GOOD_MANIFEST, "module": module})
    if module == "link.py":
        (root / "link.py").symlink_to(layout.outside / "evil.py")
    package = Package(root.resolve(), load_manifest(root / "podium.json"))
    with pytest.raises(PackageError, match="outside the package") as refused:
        asyncio.run(create_backend(package).load())
    assert refused.value.param == "module"
    assert not layout.marker.exists()
