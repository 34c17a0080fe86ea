"""The precomputed path: `podium batch` fills the result cache (resuming after a crash), and
the live path answers from a fresh entry of its own version, computing otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from podium.backends.base import InferenceRequest, Tensor
from podium.examples.builders import write_xgb_example
from podium.examples.recommend import recommend_manifest, write_recommend_example
from podium.package.package import write_manifest
from podium.repository import ModelRepository, scan_repository

MEMBERS = [f"m{i}" for i in range(20)]
CRASHING_POST = '''
import os
from podium.examples.recommend_post import finish as _finish

def finish(**kwargs):
    return _finish(**kwargs)

def crash_at(member, **kwargs):
    if member == os.environ.get("CRASH_AT"):
        os._exit(3)  # a crash: nothing after this runs, nothing is cleaned up
    return finish(**kwargs)
'''


def _write(repository: Path, version: str = "1", ttl_s: int = 3600) -> None:
    manifest = recommend_manifest("absent-llm")
    manifest["version"] = version
    manifest["steps"] = [s for s in manifest["steps"] if s["name"] != "pick"]
    manifest["steps"][0]["variants"] = [{"name": "control", "weight": 1}]
    post = manifest["steps"][-1]
    post["args"].pop("picked")
    post["args"]["member"] = "$input.member_id"
    post["function"] = "post.py:crash_at"
    manifest["result_cache"] = {"url": "sqlite:///results.db", "key": "member_id",
                                "ttl_s": ttl_s}
    write_manifest(repository / "recommend", manifest)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("batch-repository")
    write_xgb_example(repository / "xgb-example")
    package = write_recommend_example(repository / "recommend", "absent-llm")
    (package / "post.py").write_text(CRASHING_POST)
    _write(repository)
    (repository / "members.jsonl").write_text(
        "".join(json.dumps({"member_id": m}) + "\n" for m in MEMBERS))
    return repository


def _batch(repository: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "podium.cli", "batch", "recommend", "--input",
         str(repository / "members.jsonl"), "--repository", str(repository),
         "--batch-size", "4", "--concurrency", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def _cached(repository: Path) -> list[tuple[str, str]]:
    """The cache's (key, version) rows; none before a batch created it (under xdist this
    module's tests may run in different processes, each with its own repository)."""
    path = repository / "recommend" / "results.db"
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'podium_pipeline_results'"
                          ).fetchone():
            return []
        return db.execute("SELECT key, version FROM podium_pipeline_results ORDER BY key"
                          ).fetchall()


def test_a_batch_killed_half_way_resumes_from_its_last_written_batch(repository: Path) -> None:
    crashed = _batch(repository, CRASH_AT="m10")
    assert crashed.returncode == 3, crashed.stderr[-2000:]
    # batches of 4 run in order: m0-m3 and m4-m7 were written, m8-m11 died at m10
    assert sorted(key for key, _ in _cached(repository)) == sorted(MEMBERS[:8])
    resumed = _batch(repository)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "20 rows, 8 already fresh, 12 computed, 0 failed" in resumed.stdout
    assert sorted(key for key, _ in _cached(repository)) == sorted(MEMBERS)


def _answer(repository: Path, member: str) -> tuple[list[str], str]:
    async def run() -> tuple[list[str], str]:
        served = ModelRepository(root=repository)
        served.register(scan_repository(repository))
        await served.load_model("xgb-example")
        await served.load_model("recommend")
        try:
            data = np.array([member.encode()], dtype=object)
            response = await served.infer("recommend", None, InferenceRequest(
                inputs={"member_id": Tensor("member_id", "BYTES", data)}))
        finally:
            await served.unload_all()
        titles = next(t for t in response.outputs if t.name == "titles").data
        return ([t.decode() if isinstance(t, bytes) else t for t in titles],
                response.parameters["pipeline_path"])
    return asyncio.run(run())


def test_the_live_path_answers_from_the_cache_then_recomputes_when_stale_or_versioned(
        repository: Path) -> None:
    if len(_cached(repository)) < len(MEMBERS):
        assert _batch(repository).returncode == 0
    cached_titles, path = _answer(repository, "m3")
    assert path == "cache"
    assert _answer(repository, "m99")[1] == "live"  # not precomputed
    with sqlite3.connect(repository / "recommend" / "results.db") as db:
        db.execute("UPDATE podium_pipeline_results SET written_at = written_at - 7200")
    live_titles, path = _answer(repository, "m3")
    assert path == "live" and live_titles == cached_titles  # past the TTL: computed again
    assert _batch(repository).returncode == 0  # fresh again
    assert _answer(repository, "m3")[1] == "cache"
    _write(repository, version="2")
    try:
        assert _answer(repository, "m3")[1] == "live"  # version 1's answers do not serve 2
    finally:
        _write(repository)
