"""Scale to zero and back on the Ray runtime (a real local Ray cluster, real `podium serve`
instances of the echo package in actors, the real gateway and control loop): an idle
deployment opened to zero stops its last actor, and a request that arrives at zero is held by
the gateway while the control plane starts an actor, then served."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from podium.control.runtime.ray import RayRuntime
from tests.support import echo_platform as platform_module
from tests.support.echo_platform import Platform, write_echo
from tests.support.ray_cluster import BODY, FIRST, INSTANCE_CPUS, ray_cluster

pytestmark = pytest.mark.ray
__all__ = ["ray_cluster"]  # the module's Ray head, as test_ray_runtime.py's


@pytest.fixture
def ray_platform(ray_cluster: Any, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[Platform]:
    monkeypatch.setattr(platform_module, "LocalRuntime", lambda store, table, workdir, **kw:
                        RayRuntime(store, table, workdir, num_cpus=INSTANCE_CPUS, **kw))
    p = Platform(tmp_path)
    stop = threading.Event()

    def feed() -> None:  # what the gateway feed does for `podium up`'s gateways
        while not stop.wait(0.1):
            p.gateway.table.held = {(model, version): num
                                    for model, versions in p.gateway.hold.counts().items()
                                    for version, num in versions.items()}

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    yield p
    stop.set()
    thread.join(5)
    p.close()


def test_an_idle_deployment_on_ray_goes_to_zero_and_a_held_request_starts_it(
        ray_platform: Platform, tmp_path: Path) -> None:
    folder = write_echo(tmp_path / "packages", "1", scale=3)
    manifest = json.loads((folder / "podium.json").read_text())
    manifest["autoscale"] = {"scale_down_cooldown_ms": 1_000}
    (folder / "podium.json").write_text(json.dumps(manifest))
    ray_platform.plane.announce(str(folder))
    assert ray_platform.wait_done(ray_platform.deploy("1", FIRST)) == "succeeded"
    [first] = ray_platform.runtime.instances()
    ray_platform.store.set_scaling("echo", "1", 0, 1)
    ray_platform.wait_for(lambda: ray_platform.runtime.instances() == [], timeout_s=90)
    assert ray_platform.gateway.table.on_demand() == {"echo": ["1"]}

    answer = httpx.post(f"{ray_platform.url}/v2/models/echo/infer", json=BODY, timeout=150)
    assert answer.status_code == 200, answer.text  # held while an actor started, then served
    assert answer.json()["outputs"][0]["data"] == [6.0]
    assert ray_platform.gateway.hold.waited[("echo", "1")][0] == 1
    [again] = ray_platform.runtime.instances()
    assert again.id != first.id and isinstance(ray_platform.runtime, RayRuntime)
