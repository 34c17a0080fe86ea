"""The precomputed path: `podium batch PIPELINE --input FILE` fills the result cache.

The pipeline and the models it calls are loaded in this process from the repository
directory (as `podium serve --repository` would), the input's rows (JSON lines: the
pipeline's inputs by name) run in batches, `concurrency` at a time, and each batch's answers
are written to the cache in one transaction. A rerun skips the keys this version already has
fresh answers for, so a batch killed half-way resumes where its last written batch ended.
With `--ray-address` the rows run on a Ray cluster instead (`pipelines.ray_batch`); this
process still reads the input, skips fresh keys and writes every batch to the cache.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.errors import InvalidArgument, NotFound, PackageError

log = logging.getLogger("podium.batch")


@dataclass
class BatchReport:
    """What one `podium batch` run did."""

    total: int
    skipped: int
    """Keys already fresh in the cache for this version (a resumed run)."""
    computed: int
    failed: int


def read_rows(path: Path, key: str) -> list[dict[str, Any]]:
    """The input file's rows; each must be a JSON object holding `key`."""
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InvalidArgument(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(row, dict) or row.get(key) is None:
                raise InvalidArgument(f"{path}:{number}: each line is a JSON object with the "
                                      f"cache key {key!r}, e.g. {{\"{key}\": \"m1\"}}")
            rows.append(row)
    return rows


Answer = tuple[str, dict[str, Any], str]
"""One computed row: its cache key, the outputs, the variant."""


async def run_batch(repository_dir: Path, name: str, input_path: Path, *,
                    batch_size: int = 64, concurrency: int = 8,
                    on_progress: Callable[[int, int], None] | None = None,
                    ray_address: str | None = None, ray_actors: int = 2) -> BatchReport:
    """Run pipeline `name` over every row of `input_path` not fresh in its cache: in this
    process, or with `ray_address` on that Ray cluster (`ray_actors` Ray Data actors, each
    running `concurrency` rows at a time; `pipelines.ray_batch`)."""
    repository, pipeline = await open_pipeline(repository_dir, name)
    try:
        if pipeline.cache is None:
            raise PackageError(f"pipeline {name!r} declares no `result_cache`; add one to its "
                               "podium.json (docs/pipelines.md)")
        cache = pipeline.cache
        key = cache.settings.key
        rows = read_rows(input_path, key)
        fresh = await asyncio.to_thread(cache.fresh_keys)
        todo = [row for row in rows if str(row[key]) not in fresh]
        report = BatchReport(len(rows), len(rows) - len(todo), 0, 0)
        if on_progress is not None:
            on_progress(report.skipped, report.total)
        if ray_address is None:
            batches = _local_batches(pipeline, todo, key, batch_size, concurrency)
        else:
            from podium.pipelines.ray_batch import ray_batches

            batches = ray_batches(repository_dir, name, todo, key, address=ray_address,
                                  batch_size=batch_size, concurrency=concurrency,
                                  num_actors=ray_actors)
        async for answers in batches:
            done = [a for a in answers if a is not None]
            await asyncio.to_thread(cache.put_many, done)
            report.computed += len(done)
            report.failed += len(answers) - len(done)
            if on_progress is not None:
                on_progress(report.skipped + report.computed + report.failed, report.total)
        return report
    finally:
        await repository.unload_all()


async def open_pipeline(repository_dir: Path, name: str) -> tuple[Any, Any]:
    """The repository (`ModelRepository`) and the loaded `Pipeline` `name`, with the models
    its steps name that the repository holds loaded in this process."""
    from podium.pipelines.backend import PipelineBackend
    from podium.repository import ModelRepository, scan_repository

    repository = ModelRepository(root=repository_dir)
    repository.register(scan_repository(repository_dir))
    if not [p for p in repository.packages.values() if p.manifest.name == name]:
        raise NotFound(f"no pipeline {name!r} in {repository_dir}")
    try:
        entries = await repository.load_model(name)
        backend = entries[-1].backend
        if not isinstance(backend, PipelineBackend):
            raise PackageError(f"{name!r} is a {backend.manifest.backend} model, not a pipeline")
        pipeline = backend.pipeline
        for model in sorted({m.partition("@")[0] for s in pipeline.graph.steps.values()
                             for m in s.models()}):
            if repository.has_model(model):
                await repository.load_model(model)
    except BaseException:
        await repository.unload_all()
        raise
    return repository, pipeline


async def run_rows(pipeline: Any, rows: list[dict[str, Any]], key: str,
                   concurrency: int) -> list[Answer | None]:
    """Each row's answer (None for a row that failed, logged), `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(row: dict[str, Any]) -> Answer | None:
        name = str(row[key])
        async with gate:
            try:
                result = await pipeline.run(row, f"batch-{name}")
            except Exception as exc:  # one failed key does not stop the batch
                log.warning("key %s failed: %s", name, exc)
                return None
        return name, result.outputs, result.variant

    return await asyncio.gather(*(one(row) for row in rows))


async def _local_batches(pipeline: Any, rows: list[dict[str, Any]], key: str, batch_size: int,
                         concurrency: int) -> AsyncIterator[list[Answer | None]]:
    for start in range(0, len(rows), batch_size):
        yield await run_rows(pipeline, rows[start:start + batch_size], key, concurrency)
