"""`podium batch --ray-address`: the rows run on a real two-node local Ray cluster (Ray Data
actors, one per node), the driver fills the same result cache the local run fills, with the
answers a live run gives; a rerun skips what is fresh."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podium.examples.builders import write_xgb_example
from podium.examples.recommend import recommend_manifest, write_recommend_example
from podium.package.package import write_manifest
from podium.pipelines.batch import open_pipeline

pytestmark = pytest.mark.ray  # starts a local Ray cluster (tests/README.md: tiers)

MEMBERS = [f"m{i}" for i in range(24)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two raylets on 127.0.0.1, one CPU each: two actors of one CPU land one per node."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray otherwise takes the machine's network address as every node's; the environment
    # reaches the `podium batch` driver and Ray's workers too
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        local = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024,
                 "num_cpus": 1}
        cluster = Cluster(initialize_head=True,
                          head_node_args={"include_dashboard": False, **local})
        try:
            ray._common.utils.reset_ray_address()  # no address-less ray.init() joins it
            cluster.add_node(**local)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            cluster.shutdown()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    write_xgb_example(tmp_path / "xgb-example")
    package = write_recommend_example(tmp_path / "recommend", "absent-llm")
    manifest = recommend_manifest("absent-llm")
    manifest["steps"] = [s for s in manifest["steps"] if s["name"] != "pick"]
    manifest["steps"][-1]["args"].pop("picked")
    manifest["steps"][0]["variants"] = [{"name": "control", "weight": 1}]
    manifest["result_cache"] = {"url": "sqlite:///results.db", "key": "member_id",
                                "ttl_s": 3600}
    write_manifest(package, manifest)
    (tmp_path / "members.jsonl").write_text(
        "".join(json.dumps({"member_id": m}) + "\n" for m in MEMBERS))
    return tmp_path


def _batch(repository: Path, address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "podium.cli", "batch", "recommend", "--input",
         str(repository / "members.jsonl"), "--repository", str(repository),
         "--batch-size", "6", "--concurrency", "2", "--ray-address", address,
         "--ray-actors", "2"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ))


def _cached(repository: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    with sqlite3.connect(repository / "recommend" / "results.db") as db:
        return {key: (version, json.loads(outputs)) for key, version, outputs in db.execute(
            "SELECT key, version, outputs FROM podium_pipeline_results")}


def _live(repository: Path, member: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        models, pipeline = await open_pipeline(repository, "recommend")
        try:
            return (await pipeline.run({"member_id": member}, "live-check")).outputs
        finally:
            await models.unload_all()
    return asyncio.run(run())


def test_a_batch_on_a_ray_cluster_fills_the_cache_with_the_live_answers(
        cluster: Any, repository: Path) -> None:
    nowhere = _batch(repository, "127.0.0.1:1")
    assert nowhere.returncode == 2, nowhere.stderr[-2000:]
    assert "no Ray cluster answers at 127.0.0.1:1" in nowhere.stderr

    done = _batch(repository, cluster.address)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "24 rows, 0 already fresh, 24 computed, 0 failed" in done.stdout, done.stdout
    cached = _cached(repository)
    assert sorted(cached) == sorted(MEMBERS)
    assert {version for version, _ in cached.values()} == {"1"}
    for member in ("m0", "m13"):
        assert cached[member][1] == _live(repository, member)

    again = _batch(repository, cluster.address)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "24 rows, 24 already fresh, 0 computed, 0 failed" in again.stdout, again.stdout
