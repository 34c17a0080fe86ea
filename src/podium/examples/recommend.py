"""The `recommend` example pipeline: member id → experiment → candidates and features from a
small SQLite catalog → xgb-example (control) or the LLM with `distinct_items` (treatment) →
post-processing. See docs/pipelines.md."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from podium.package.package import write_manifest

GENRES = ("drama", "comedy", "thriller", "documentary")
NUM_TITLES_PER_GENRE = 12
NUM_MEMBERS = 200
POST_SOURCE = Path(__file__).with_name("recommend_post.py")
FEATURES = [f"f{i}" for i in range(20)]


def write_catalog(path: Path) -> None:
    """members(member_id, genre) and titles(title, genre, f0..f19), deterministic."""
    from podium.examples.builders import synthetic_features

    features = synthetic_features(len(GENRES) * NUM_TITLES_PER_GENRE, seed=7)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE members (member_id TEXT PRIMARY KEY, genre TEXT NOT NULL)")
        columns = ", ".join(f"{name} REAL NOT NULL" for name in FEATURES)
        db.execute(f"CREATE TABLE titles (title TEXT PRIMARY KEY, genre TEXT NOT NULL, "
                   f"{columns})")
        db.executemany("INSERT INTO members VALUES (?, ?)",
                       [(f"m{i}", GENRES[i % len(GENRES)]) for i in range(NUM_MEMBERS)])
        rows = []
        for index, row in enumerate(features):
            genre = GENRES[index // NUM_TITLES_PER_GENRE]
            title = f"{genre.title()} Title {index % NUM_TITLES_PER_GENRE + 1}"
            rows.append((title, genre, *map(float, row)))
        marks = ", ".join("?" * (2 + len(FEATURES)))
        db.executemany(f"INSERT INTO titles VALUES ({marks})", rows)


def recommend_manifest(llm: str) -> dict[str, Any]:
    """The pipeline's podium.json."""
    catalog = "sqlite:///catalog.db"
    return {
        "name": "recommend", "version": "1", "backend": "pipeline",
        "description": "member id → experiment → candidates + features → xgb-example or the "
                       "LLM (distinct_items) → three titles",
        "inputs": [{"name": "member_id", "datatype": "BYTES", "shape": [1]}],
        "outputs": [
            {"name": "titles", "datatype": "BYTES", "shape": [-1], "from": "$post.titles"},
            {"name": "variant", "datatype": "BYTES", "shape": [1], "from": "$arm.variant"},
            {"name": "ranked_by", "datatype": "BYTES", "shape": [1], "from": "$post.ranked_by"},
        ],
        "deadline_ms": 60_000,
        "steps": [
            {"name": "arm", "kind": "experiment", "key": "$input.member_id",
             "salt": "recommend-2026-12",
             "variants": [{"name": "control", "weight": 50},
                          {"name": "treatment", "weight": 50}]},
            {"name": "member", "kind": "features", "keys": "$input.member_id",
             "columns": ["genre"], "defaults": {"genre": "drama"},
             "source": {"type": "sql", "url": catalog, "table": "members",
                        "key_column": "member_id"}},
            {"name": "cands", "kind": "candidates", "key": "$member.row.genre",
             "item_column": "title", "limit": 12,
             "source": {"type": "sql", "url": catalog, "table": "titles",
                        "key_column": "genre"}},
            {"name": "feats", "kind": "features", "keys": "$cands.items", "columns": FEATURES,
             "source": {"type": "sql", "url": catalog, "table": "titles",
                        "key_column": "title"}},
            {"name": "rank", "kind": "model", "model": "xgb-example",
             "when_variant": ["control"], "inputs": {"features": "$feats.matrix"},
             "timeout_ms": 5000},
            {"name": "pick", "kind": "model", "model": llm, "when_variant": ["treatment"],
             "prompt": "Recommend three titles to a member who likes {genre}, from: "
                       "{titles}\nAnswer with a JSON list: ",
             "vars": {"genre": "$member.row.genre", "titles": "$cands.items"},
             "constraint": {"type": "distinct_items", "items": "$cands.items",
                            "min": 3, "max": 3},
             "sampling": {"max_tokens": 96, "temperature": 0}},
            {"name": "post", "kind": "python", "function": "post.py:finish", "inline": True,
             "args": {"items": "$cands.items", "scores": "$rank.probability",
                      "picked": "$pick.json"}},
        ],
    }


def write_recommend_example(directory: Path, llm: str) -> Path:
    """The pipeline package: podium.json, catalog.db and post.py."""
    directory.mkdir(parents=True, exist_ok=True)
    write_catalog(directory / "catalog.db")
    shutil.copyfile(POST_SOURCE, directory / "post.py")
    write_manifest(directory, recommend_manifest(llm))
    return directory
