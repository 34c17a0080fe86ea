"""`features`: rows of features by key from a source (SQL table, Feast, a plugin).

Result: `{"rows": [{column: value}, ...], "matrix": [[value, ...], ...], "missing": [key, ...]}`
in key order (one row per key, duplicates kept), and `row` (the first row) for a single key.
A key the source lacks takes `defaults`; without a default for one of its columns the step
fails (and its fallback decides).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from podium.errors import BackendError, RequestTimeout
from podium.pipelines.sources import FeatureSource, create_source
from podium.pipelines.steps.base import CallContext, StepEnv, StepSpec

log = logging.getLogger(__name__)

INLINE_MAX_S = 0.02
"""An inline read longer than this is slow (a fast one takes ~0.2 ms; a busy loop, the GIL
held by another thread or a GC pause can stretch one to a few ms)."""
INLINE_MAX_SLOW = 3
"""Slow inline reads a source may have before its reads move to worker threads for good."""


class FeaturesStep(StepSpec):
    """Fetch `columns` for `keys` from `source`."""

    kind: Literal["features"]
    source: dict[str, Any] = Field(description="`{\"type\": \"sql\", ...}`; see "
                                   "docs/pipelines.md for each type's fields.")
    keys: Any = Field(description="Reference to one key or a list of keys.")
    columns: list[str] = Field(min_length=1, description="Feature columns, in matrix order.")
    defaults: dict[str, Any] = Field(default_factory=dict,
                                     description="Values for keys the source lacks.")
    source_timeout_ms: int = Field(default=1000, ge=1, le=600_000,
                                   description="Longest one read from the source may take.")
    _source: FeatureSource | None = PrivateAttr(default=None)

    def settings(self) -> dict[str, Any]:
        return {"keys": self.keys}

    def prepare(self, env: StepEnv) -> None:
        self._source = create_source(self.source, env.root)
        self._source.open(self.columns)

    async def run(self, args: dict[str, Any], call: CallContext) -> Any:
        keys = args["keys"]
        single = not isinstance(keys, list)
        keys = [keys] if single else keys
        found = await read_source(self._source, self.source_timeout_ms, self.name,
                                  lambda source: source.fetch(keys, self.columns))
        rows, missing = [], []
        for key in keys:
            row = found.get(key)
            if row is None:
                missing.append(key)
                row = self._default_row(key)
            rows.append(row)
        result = {"rows": rows, "matrix": [[row[c] for c in self.columns] for row in rows],
                  "missing": missing}
        if single:
            result["row"] = rows[0]
        return result

    def _default_row(self, key: Any) -> dict[str, Any]:
        lacking = [c for c in self.columns if c not in self.defaults]
        if lacking:
            raise BackendError(f"step {self.name!r}: key {key!r} is not in the source and "
                               f"`defaults` has no value for {', '.join(lacking)}")
        return {c: self.defaults[c] for c in self.columns}


async def read_source(source: FeatureSource | None, timeout_ms: int, step: str, read: Any
                      ) -> Any:
    """One read, bounded by the source's timeout: in a worker thread, or on the event loop
    when the source says its reads are fast (`FeatureSource.inline`). An inline read cannot
    be interrupted: after `INLINE_MAX_SLOW` reads over `INLINE_MAX_S` its source moves to
    worker threads for good (logged), so a slow disk or a locked file stalls the loop a few
    times at most."""
    assert source is not None, "prepare() runs before run()"
    if source.inline:
        started = time.perf_counter()
        try:
            return read(source)
        finally:
            took = time.perf_counter() - started
            if took > INLINE_MAX_S and source.inline:
                source.slow_reads += 1
                if source.slow_reads >= INLINE_MAX_SLOW:
                    source.inline = False
                    log.info("step %r: %d reads from its %s took over %.0f ms on the event "
                             "loop (the last %.1f ms); its reads go to worker threads from "
                             "now on", step, source.slow_reads, type(source).__name__,
                             INLINE_MAX_S * 1000, took * 1000)
    try:
        return await asyncio.wait_for(asyncio.to_thread(read, source), timeout_ms / 1000)
    except TimeoutError:
        raise RequestTimeout(f"step {step!r}: the source did not answer within "
                             f"source_timeout_ms={timeout_ms}") from None
