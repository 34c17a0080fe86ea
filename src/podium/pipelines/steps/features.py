"""`features`: rows of features by key from a source (SQL table, Feast, a plugin).

Result: `{"rows": [{column: value}, ...], "matrix": [[value, ...], ...], "missing": [key, ...]}`
in key order (one row per key, duplicates kept), and `row` (the first row) for a single key.
A key the source lacks takes `defaults`; without a default for one of its columns the step
fails (and its fallback decides).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from podium.errors import BackendError, RequestTimeout
from podium.pipelines.sources import FeatureSource, create_source
from podium.pipelines.steps.base import CallContext, StepEnv, StepSpec


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
    """One blocking read in a worker thread, bounded by the source's timeout."""
    assert source is not None, "prepare() runs before run()"
    try:
        return await asyncio.wait_for(asyncio.to_thread(read, source), timeout_ms / 1000)
    except TimeoutError:
        raise RequestTimeout(f"step {step!r}: the source did not answer within "
                             f"source_timeout_ms={timeout_ms}") from None
