"""The `feast` source against a real Feast feature repository on its SQLite online store,
created here (apply + write to the online store), read by a pipeline's features step."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

from podium.errors import PackageError
from tests.support.pipelines import build


@pytest.fixture(scope="module")
def feast_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import pandas as pd
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Float32, String

    package = tmp_path_factory.mktemp("feast-package")
    repo = package / "feature_repo"
    (repo / "data").mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(
        "project: podium_test\nregistry: data/registry.db\nprovider: local\n"
        "online_store:\n  type: sqlite\n  path: data/online.db\n"
        "entity_key_serialization_version: 3\n")
    now = dt.datetime.now(dt.UTC)
    frame = pd.DataFrame({"title": ["Alpha", "Beta"], "f0": [0.25, 0.75],
                          "genre": ["drama", "comedy"], "ts": [now, now]})
    frame.to_parquet(repo / "data" / "titles.parquet")
    title = Entity(name="title", join_keys=["title"], value_type=ValueType.STRING)
    view = FeatureView(
        name="titles", entities=[title], ttl=dt.timedelta(days=3650), online=True,
        schema=[Field(name="f0", dtype=Float32), Field(name="genre", dtype=String)],
        source=FileSource(path=str(repo / "data" / "titles.parquet"), timestamp_field="ts"))
    store = FeatureStore(repo_path=str(repo))
    store.apply([title, view])
    store.write_to_online_store("titles", frame)
    return package


def _step(columns: list[str]) -> dict[str, object]:
    return {"name": "feats", "kind": "features", "keys": "$input.member_id",
            "columns": columns, "defaults": {"f0": 0.0, "genre": "unknown"},
            "source_timeout_ms": 60_000,  # what is read is the point here, not the deadline
            "source": {"type": "feast", "repo_path": "feature_repo", "feature_view": "titles",
                       "entity": "title"}}


def test_a_features_step_reads_the_feast_online_store_with_defaults(feast_repo: Path,
                                                                   models) -> None:
    pipeline = build(feast_repo, models, [_step(["f0", "genre"])])
    found = asyncio.run(pipeline.run({"member_id": "Beta"}, "r")).results["feats"]
    assert found["row"] == {"f0": pytest.approx(0.75), "genre": "comedy"}
    missing = asyncio.run(pipeline.run({"member_id": "Zeta"}, "r")).results["feats"]
    assert missing["row"] == {"f0": 0.0, "genre": "unknown"} and missing["missing"] == ["Zeta"]


def test_a_feature_the_view_lacks_is_refused_at_load(feast_repo: Path, models) -> None:
    with pytest.raises(PackageError, match=r"step 'feats' .*has no feature 'f9'"):
        build(feast_repo, models, [_step(["f0", "f9"])])


def test_the_recommend_examples_feast_variant_ranks_like_the_sql_one(tmp_path: Path) -> None:
    import numpy as np

    from podium.backends.base import InferenceRequest, Tensor
    from podium.examples.builders import write_xgb_example
    from podium.examples.recommend import recommend_manifest, write_recommend_example
    from podium.examples.recommend_feast import use_feast, write_feature_repo
    from podium.package.package import write_manifest
    from podium.repository import ModelRepository, scan_repository

    write_xgb_example(tmp_path / "xgb-example")
    package = write_recommend_example(tmp_path / "recommend", "absent-llm")
    write_feature_repo(package)

    def control_only(manifest: dict) -> dict:
        manifest["steps"] = [s for s in manifest["steps"] if s["name"] != "pick"]
        manifest["steps"][0]["variants"] = [{"name": "control", "weight": 1}]
        manifest["steps"][-1]["args"].pop("picked")
        return manifest

    async def titles(manifest: dict) -> list[str]:
        write_manifest(package, manifest)
        served = ModelRepository(root=tmp_path)
        served.register(scan_repository(tmp_path))
        await served.load_model("xgb-example")
        await served.load_model("recommend")
        try:
            member = np.array([b"m3"], dtype=object)
            answer = await served.infer("recommend", None, InferenceRequest(
                inputs={"member_id": Tensor("member_id", "BYTES", member)}))
        finally:
            await served.unload_all()
        found = next(t for t in answer.outputs if t.name == "titles").data
        return [t.decode() if isinstance(t, bytes) else t for t in found]

    from_sql = asyncio.run(titles(control_only(recommend_manifest("absent-llm"))))
    from_feast = asyncio.run(titles(use_feast(control_only(recommend_manifest("absent-llm")))))
    assert len(from_feast) == 3 and from_feast == from_sql
