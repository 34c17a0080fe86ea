"""`GET /v1/engines?model=M`: the LLM figures of a model's versions in one region (tokens/s,
time to first token p50/p99, KV-cache usage, queue), read from their instances' /metrics by
`EngineFigures`. Versions whose package is not an LLM are left out (nothing to scrape)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query

from podium.control.engine_figures import EngineFigures
from podium.control.store import Store
from podium.errors import NotFound

LLM_BACKENDS = ("vllm",)


def wanted_versions(store: Store, region: str | None,
                    kinds: tuple[str, ...]) -> Callable[[str], list[str]]:
    """model -> its versions in `region` with instances wanted whose package's backend is one
    of `kinds` (each package's backend read once: packages never change)."""
    backends: dict[tuple[str, str], str] = {}

    def backend(model: str, version: str) -> str:
        if (model, version) not in backends:
            try:
                backends[(model, version)] = store.get_package(model, version).backend
            except NotFound:
                return ""
        return backends[(model, version)]

    def versions(model: str) -> list[str]:
        return [d.version for d in store.list_deployments(model, region=region)
                if d.num_desired > 0 and backend(model, d.version) in kinds]

    return versions


def add_engine_routes(app: FastAPI, store: Store, figures: EngineFigures, *,
                      region: str | None = None, prefix: str = "") -> None:
    """Serve a region's engine figures on the control API `app` (under `prefix`)."""
    llm_versions = wanted_versions(store, region, LLM_BACKENDS)

    @app.get(prefix + "/v1/engines")
    def engines(model: Annotated[str, Query(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$",
                                            description="The model.")]) -> dict[str, Any]:
        """Per LLM version of `model` with instances wanted: its engines' figures now."""
        return {"model": model,
                "versions": {v: figures.read(model, v) for v in llm_versions(model)}}
