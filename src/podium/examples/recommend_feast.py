"""The `recommend` example's Feast variant: the title features served from a Feast feature
repository (SQLite online store) instead of the catalog table. Needs the `feast` extra.

`write_feature_repo(package)` writes `feature_repo/` inside the pipeline package (the titles'
f0..f19 as a parquet file, a `titles` feature view keyed by `title`), applies it and loads
the online store; `use_feast(manifest)` points the `feats` step at it.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

from podium.examples.recommend import FEATURES

STORE_YAML = """project: podium_recommend
registry: data/registry.db
provider: local
online_store:
  type: sqlite
  path: data/online.db
entity_key_serialization_version: 3
"""


def write_feature_repo(package: Path) -> Path:
    """Build and load the Feast repository from the package's catalog.db."""
    import pandas as pd
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Float32

    repo = package / "feature_repo"
    (repo / "data").mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(STORE_YAML)
    with sqlite3.connect(package / "catalog.db") as db:
        rows = db.execute(f"SELECT title, {', '.join(FEATURES)} FROM titles").fetchall()
    frame = pd.DataFrame(rows, columns=["title", *FEATURES])
    frame["ts"] = dt.datetime.now(dt.UTC)
    frame.to_parquet(repo / "data" / "titles.parquet")
    title = Entity(name="title", join_keys=["title"], value_type=ValueType.STRING)
    view = FeatureView(
        name="titles", entities=[title], ttl=dt.timedelta(days=3650), online=True,
        schema=[Field(name=name, dtype=Float32) for name in FEATURES],
        source=FileSource(path=str(repo / "data" / "titles.parquet"), timestamp_field="ts"))
    store = FeatureStore(repo_path=str(repo))
    store.apply([title, view])
    store.write_to_online_store("titles", frame)
    return repo


def use_feast(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its `feats` step reading the Feast repository."""
    for step in manifest["steps"]:
        if step["name"] == "feats":
            step["source"] = {"type": "feast", "repo_path": "feature_repo",
                              "feature_view": "titles", "entity": "title"}
    return manifest
