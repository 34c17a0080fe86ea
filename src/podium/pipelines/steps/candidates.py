"""`candidates`: a candidate set from a source, a model or a Python function.

Result: `{"items": [...]}` (a function may return a list or a dict with `items`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from podium.errors import BackendError
from podium.pipelines.sources import FeatureSource, create_source
from podium.pipelines.steps.base import CallContext, StepEnv, StepSpec, load_function
from podium.pipelines.steps.features import read_source
from podium.pipelines.steps.model import ModelStep
from podium.pipelines.steps.python_step import call_function


class CandidatesStep(StepSpec):
    """Exactly one of `source`, `function` or `model`."""

    kind: Literal["candidates"]
    source: dict[str, Any] | None = Field(
        default=None, description="A source (e.g. `sql`) and `item_column`: the items whose "
        "key column equals `key`.")
    key: Any = Field(default=None, description="Reference to the key (with `source`).")
    item_column: str | None = Field(default=None, description="Column holding the items.")
    limit: int = Field(default=100, ge=1, le=100_000, description="Most candidates.")
    function: str | None = Field(default=None, description="`file.py:function` returning a "
                                 "list (or `{\"items\": [...]}`), called with `args`.")
    args: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] | None = Field(
        default=None, description="A `model` step's settings; its `items_output` output "
        "(flattened) is the candidate set.")
    items_output: str | None = Field(default=None)
    source_timeout_ms: int = Field(default=1000, ge=1, le=600_000)
    _source: FeatureSource | None = PrivateAttr(default=None)
    _function: Callable[..., Any] | None = PrivateAttr(default=None)
    _model: ModelStep | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_origin(self) -> CandidatesStep:
        given = [n for n in ("source", "function", "model") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of source, function, model (got "
                             f"{', '.join(given) or 'none'})")
        if self.source is not None and (self.item_column is None or self.key is None):
            raise ValueError("a source needs `key` and `item_column`")
        if self.model is not None and self.items_output is None:
            raise ValueError("a model needs `items_output` (the output holding the items)")
        if self.model is not None:
            self._model = ModelStep(name=self.name, kind="model", **self.model)
        return self

    def settings(self) -> dict[str, Any]:
        return {"key": self.key, "args": self.args,
                "model": self._model.settings() if self._model is not None else None}

    def models(self) -> list[str]:
        return self._model.models() if self._model is not None else []

    def prepare(self, env: StepEnv) -> None:
        if self.source is not None:
            self._source = create_source(self.source, env.root)
            self._source.open([self.item_column or ""])
        if self.function is not None:
            self._function = load_function(env.root, self.function, env.functions)
        if self._model is not None:
            self._model.prepare(env)

    async def run(self, args: dict[str, Any], call: CallContext) -> Any:
        if self._source is not None:
            key, column = args["key"], self.item_column
            items = await read_source(self._source, self.source_timeout_ms, self.name,
                                      lambda s: s.candidates(key, column, self.limit))
        elif self._model is not None:
            outputs = await self._model.run(args["model"], call)
            items = _flatten(outputs.get(self.items_output))
        else:
            items = await call_function(self._function, args["args"])
            if isinstance(items, dict):
                items = items.get("items")
        if not isinstance(items, list):
            raise BackendError(f"step {self.name!r}: candidates must be a list, got "
                               f"{type(items).__name__}")
        return {"items": items[:self.limit]}


def _flatten(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    return [x for item in value for x in _flatten(item)]
