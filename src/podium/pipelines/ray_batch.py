"""`podium batch --ray-address`: the precomputed path's rows run on a Ray cluster (Ray Data).

The rows become a Ray dataset; `map_batches` hands each batch to one of `num_actors` actors
(`_RowRunner`), each of which loads the pipeline and the models its steps name from the
repository once, as the local batch does in its own process, and runs a batch's rows
`concurrency` at a time. The driver (`podium batch`) receives the answered batches as they
finish and writes each to the result cache before the next, so a run killed half-way
resumes like a local one. The repository must be readable at the same path on every node
(one machine, or a shared filesystem); the cache is written by the driver only.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from podium.errors import InvalidArgument, Unavailable
from podium.pipelines.batch import Answer, open_pipeline, run_rows


class _RowRunner:
    """A Ray Data actor: one pipeline, loaded once, answering batches of rows."""

    def __init__(self, repository: str, name: str, key: str, concurrency: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.repository, self.pipeline = self.loop.run_until_complete(
            open_pipeline(Path(repository), name))
        self.key, self.concurrency = key, concurrency

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        rows = [json.loads(row) for row in batch["row"]]
        answers = self.loop.run_until_complete(
            run_rows(self.pipeline, rows, self.key, self.concurrency))
        return {
            "key": np.array([str(row[self.key]) for row in rows], dtype=object),
            "ok": np.array([a is not None for a in answers], dtype=bool),
            "outputs": np.array([json.dumps(a[1]) if a else "" for a in answers], dtype=object),
            "variant": np.array([a[2] if a else "" for a in answers], dtype=object)}


async def ray_batches(repository_dir: Path, name: str, rows: list[dict[str, Any]], key: str,
                      *, address: str, batch_size: int, concurrency: int,
                      num_actors: int) -> AsyncIterator[list[Answer | None]]:
    """The answers of `rows`, one list per batch as Ray finishes it (None: a row failed)."""
    if not rows:
        return
    import ray

    joined = _connect(ray, address)
    try:
        dataset = ray.data.from_items([{"row": json.dumps(row)} for row in rows],
                                      override_num_blocks=-(-len(rows) // batch_size))
        answered = dataset.map_batches(
            _RowRunner, fn_constructor_kwargs={
                "repository": str(Path(repository_dir).resolve()), "name": name, "key": key,
                "concurrency": concurrency},
            batch_size=batch_size, batch_format="numpy", concurrency=num_actors, num_cpus=1)
        batches = iter(answered.iter_batches(batch_size=batch_size, batch_format="numpy"))
        while (batch := await asyncio.to_thread(next, batches, None)) is not None:
            yield [(str(k), json.loads(o), str(v)) if ok else None
                   for k, ok, o, v in zip(batch["key"], batch["ok"], batch["outputs"],
                                          batch["variant"], strict=True)]
    finally:
        if joined:
            ray.shutdown()


def _connect(ray: Any, address: str) -> bool:
    """Join the cluster at `address` (HOST:PORT of its head, or `auto`); False if this
    process had joined one already. An address nothing answers at fails in seconds."""
    if ray.is_initialized():
        return False
    if address != "auto":
        host, _, port = address.split("://", 1)[-1].rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"--ray-address {address!r} must be HOST:PORT of the Ray head, "
                              "e.g. 10.0.0.5:6379, or auto", param="ray_address")
        try:
            with socket.create_connection((host, int(port)), timeout=3):
                pass
        except OSError as exc:
            raise Unavailable(f"no Ray cluster answers at {address} "
                              f"({exc.strerror or exc}); start one with `ray start --head` "
                              "or leave out --ray-address to batch in this process",
                              param="ray_address") from None
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True
