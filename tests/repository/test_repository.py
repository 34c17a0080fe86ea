"""The model repository: scanning layouts, version policies, load/unload with requests in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from podium.backends.base import InferenceRequest, Tensor
from podium.errors import BackendError, InvalidArgument, NotFound, PackageError
from podium.package.package import build_package, write_manifest
from podium.repository import ModelRepository, VersionPolicy, scan_repository
from podium.repository.entry import UNLOADING
from tests.support.polling import async_eventually
from tests.support.versioned import write_versioned


def request() -> InferenceRequest:
    return InferenceRequest({"x": Tensor("x", "FP32", np.zeros((1, 1), dtype=np.float32))})


async def served_version(repository: ModelRepository, name: str,
                         version: str | None = None) -> float:
    response = await repository.infer(name, version, request())
    value = float(response.outputs[0].data[0, 0])
    assert response.model_version == f"{value:g}", "the response names the version that served"
    return value


def test_scan_finds_every_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    repo = tmp_path / "repo"
    write_versioned(repo / "flat", "flat", "1")
    write_versioned(repo / "nested" / "1", "nested", "1")
    write_versioned(repo / "nested" / "2", "nested", "2")
    build_package(write_versioned(tmp_path / "src", "packed", "3"), repo / "packed.tar.gz")
    keys = [p.key for p in scan_repository(repo)]
    assert keys == ["flat@1", "nested@1", "nested@2", "packed@3"]


def test_scan_rejects_duplicates_and_non_directories(tmp_path: Path) -> None:
    write_versioned(tmp_path / "a", "same", "1")
    write_versioned(tmp_path / "b", "same", "1")
    with pytest.raises(PackageError, match="same@1 is packaged twice"):
        scan_repository(tmp_path)
    with pytest.raises(PackageError, match="must be a directory"):
        scan_repository(tmp_path / "missing")


@pytest.mark.parametrize(("policy", "available", "expected"), [
    ({}, ["1", "2", "10"], ["10"]),
    ({"latest": {"num_versions": 2}}, ["1", "2", "10"], ["2", "10"]),
    ({"specific": {"versions": [1, "2"]}}, ["1", "2", "10"], ["1", "2"]),
    ({"all": {}}, ["10", "1"], ["1", "10"]),
], ids=["default-newest", "latest-2", "specific", "all"])
def test_version_policy_selects(policy: dict, available: list[str], expected: list[str]) -> None:
    assert VersionPolicy.parse(policy).select(available) == expected


@pytest.mark.parametrize("policy", [{"latest": {"num_versions": 0}}, {"newest": {}},
                                    {"specific": {"versions": []}}, {"all": {}, "latest": {}},
                                    {"latest": 5}, {"specific": ["1"]}, {"all": "yes"},
                                    {"latest": {"num_versions": True}},
                                    {"specific": {"versions": [{"v": 1}]}},
                                    {"specific": {"versions": [""]}}],
                         ids=["zero", "unknown-kind", "empty-specific", "two-kinds",
                              "latest-not-object", "specific-not-object", "all-not-object",
                              "latest-bool", "specific-object-version", "specific-empty-version"])
def test_bad_version_policy_is_rejected(policy: dict) -> None:
    with pytest.raises(InvalidArgument, match="version_policy"):
        VersionPolicy.parse(policy)


def test_load_by_name_follows_the_policy(tmp_path: Path) -> None:
    for version in ("1", "2", "3"):
        write_versioned(tmp_path / "m" / version, "m", version)

    async def run() -> None:
        repository = ModelRepository(root=tmp_path)
        await repository.load_model("m", VersionPolicy.parse({"latest": {"num_versions": 2}}))
        assert await served_version(repository, "m") == 3  # no version: the latest ready
        assert await served_version(repository, "m", "2") == 2
        with pytest.raises(NotFound, match="no version '1'"):
            await served_version(repository, "m", "1")
        # a new policy loads what it adds and unloads what it drops
        await repository.load_model("m", VersionPolicy.parse({"specific": {"versions": ["1"]}}))
        assert await served_version(repository, "m") == 1
        states = {(r["version"]): r["state"] for r in repository.index()}
        assert states == {"1": "READY", "2": "UNAVAILABLE", "3": "UNAVAILABLE"}
        # packages dropped into the directory later are found at the next load
        write_versioned(tmp_path / "m" / "4", "m", "4")
        await repository.load_model("m")
        assert await served_version(repository, "m") == 4
        with pytest.raises(NotFound, match="no package for model 'x'"):
            await repository.load_model("x")
        await repository.unload_all()

    asyncio.run(run())


def test_a_lease_resolves_the_version_once_and_holds_it(tmp_path: Path) -> None:
    for version in ("1", "2"):
        write_versioned(tmp_path / "m" / version, "m", version)

    async def run() -> None:
        repository = ModelRepository(root=tmp_path)
        await repository.load_model("m", VersionPolicy.parse({"all": {}}))
        async with repository.lease("m") as entry:
            assert (entry.name, entry.version, entry.in_flight) == ("m", "2", 1)
            unload = asyncio.create_task(repository.unload("m", "2"))
            assert await async_eventually(lambda: entry.state == UNLOADING)
            assert not unload.done(), "unload waits for the lease"
            assert await served_version(repository, "m") == 1  # new requests go elsewhere
        await unload
        assert entry.in_flight == 0 and entry.stats.success.count == 0
        await repository.unload_all()

    asyncio.run(run())


def test_unload_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    write_versioned(tmp_path / "slow", "slow", "1", delay_s=0.3)

    async def run() -> None:
        repository = ModelRepository(root=tmp_path)
        await repository.load_model("slow")
        entry = repository.find("slow")
        in_flight = asyncio.create_task(served_version(repository, "slow"))
        assert await async_eventually(lambda: entry.in_flight == 1)  # the request holds it
        await repository.unload("slow")
        assert in_flight.done()  # unload waited for the request
        assert await in_flight == 1.0
        with pytest.raises(NotFound):
            await served_version(repository, "slow")

    asyncio.run(run())


def test_statistics_count_failures(tmp_path: Path) -> None:
    write_versioned(tmp_path / "m", "m", "1")

    async def run() -> dict:
        repository = ModelRepository(root=tmp_path)
        await repository.load_model("m")
        await served_version(repository, "m")
        with pytest.raises(InvalidArgument):
            await repository.infer("m", None, InferenceRequest({}))
        stats = repository.statistics("m")[0]
        await repository.unload_all()
        return stats

    stats = asyncio.run(run())
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_count"] == 1
    assert stats["execution_count"] == 1


def test_a_failed_load_reports_why_and_leaves_the_rest_serving(tmp_path: Path) -> None:
    write_versioned(tmp_path / "good", "good", "1")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.json").write_text("not a booster")
    write_manifest(broken, {"name": "broken", "backend": "xgboost"})

    async def run() -> None:
        repository = ModelRepository(root=tmp_path)
        await repository.load_model("good")
        with pytest.raises(BackendError, match=r"loading broken@1 failed"):
            await repository.load_model("broken")
        rows = {row["name"]: row for row in repository.index()}
        assert rows["broken"]["state"] == "UNAVAILABLE"
        assert "XGBoost" in rows["broken"]["reason"] or "Error" in rows["broken"]["reason"]
        assert repository.all_ready()  # the failure does not hold readiness back
        assert await served_version(repository, "good") == 1
        await repository.unload_all()

    asyncio.run(run())
