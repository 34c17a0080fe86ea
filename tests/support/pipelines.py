"""Pipeline test helpers: a fake model host answering in-process, a SQLite catalog, a
pipeline built from steps."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from podium.backends.base import InferenceRequest, InferenceResponse, Tensor
from podium.package.manifest import parse_manifest
from podium.pipelines.pipeline import Pipeline


class FakeModels:
    """`scorer` sums each feature row; `llm` echoes its sampling parameters' constraint
    items; `slow` sleeps; anything else does not exist."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def has_model(self, name: str, version: str | None = None) -> bool:
        return name in ("scorer", "llm", "slow") and version in (None, "1")

    async def infer(self, name: str, version: str | None, request: InferenceRequest
                    ) -> InferenceResponse:
        self.calls.append((name, version))
        if name == "slow":
            await asyncio.sleep(5)
        if name == "llm":
            params = json.loads(request.inputs["sampling_parameters"].data[0])
            picked = params["constraint"]["items"][:params["constraint"]["max"]]
            text = np.array([json.dumps(picked).encode()], dtype=object)
            return InferenceResponse([Tensor("text_output", "BYTES", text)])
        rows = request.inputs["features"].data
        return InferenceResponse([Tensor("probability", "FP32",
                                         rows.sum(axis=1, keepdims=True))])


def manifest(steps: list[dict[str, Any]], outputs: list[dict[str, Any]] | None = None,
             **extra: Any) -> Any:
    return parse_manifest({
        "name": "p", "backend": "pipeline",
        "inputs": [{"name": "member_id", "datatype": "BYTES", "shape": [1]}],
        "outputs": outputs or [{"name": "out", "datatype": "BYTES", "shape": [-1],
                                "from": f"${steps[-1]['name']}"}],
        "steps": steps, **extra})


def build(root: Path, models: Any, steps: list[dict[str, Any]], **extra: Any) -> Pipeline:
    return Pipeline(manifest(steps, **extra), root, models)


def write_catalog(path: Path) -> Path:
    """A SQLite catalog: members (genre), titles (genre, f0, f1)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE members (member_id TEXT PRIMARY KEY, genre TEXT)")
        db.execute("CREATE TABLE titles (title TEXT PRIMARY KEY, genre TEXT, f0 REAL, f1 REAL)")
        db.executemany("INSERT INTO members VALUES (?, ?)", [("m1", "drama"), ("m2", "comedy")])
        db.executemany("INSERT INTO titles VALUES (?, ?, ?, ?)", [
            ("Alpha", "drama", 0.1, 0.2), ("Beta", "drama", 0.9, 0.9),
            ("Gamma", "drama", 0.5, 0.1), ("Delta", "comedy", 0.3, 0.3)])
    return path
