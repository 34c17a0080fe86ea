"""Assembly of one instance's HTTP app: health, OpenAI /v1 (embedded only), KServe /v2,
/metrics."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from podium.auth import ApiKeyMiddleware
from podium.errors.http import install_error_handlers
from podium.errors.render import instance_shape
from podium.metrics import request_log
from podium.metrics.exposition import create_router as metrics_router
from podium.server.frontends import Frontends
from podium.server.instance import BootStep, Instance


def build_app(instance: Instance, *, lifespan: Any = None) -> FastAPI:
    """The FastAPI app of one instance (routes only; boot runs in `lifespan`). The /v1 routes
    are `instance.frontends`'; when that is None, boot mounts them once it knows. The request
    head is bounded by the HTTP protocol `serve.uvicorn_config` serves it with."""
    from podium import __version__

    app = FastAPI(title="Podium instance", version=__version__, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.instance = instance
    install_error_handlers(app, instance_shape)
    _add_health_routes(app, instance)
    frontends = Frontends(app, instance)
    frontends.mount(instance.frontends)
    instance.mount_frontends = frontends.settle
    _include_optional_routers(app, instance)
    if instance.config.access().guarded:
        app.add_middleware(ApiKeyMiddleware, access=instance.config.access(),
                           metrics_open=instance.config.metrics_open)
    # outermost, so requests refused by the key check are logged with their ids too
    request_log.install(app, instance.config.log_format)
    return app


def _add_health_routes(app: FastAPI, instance: Instance) -> None:
    @app.get("/health")
    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        body = {
            "status": instance.status(),
            "frontends": instance.frontends,
            "models": {e.key: e.state.lower()
                       for e in instance.repository.entries()},
            "boot_steps": [_boot_step(s) for s in instance.boot_steps],
        }
        if instance.boot_error:
            body["error"] = instance.boot_error
        return JSONResponse(body, status_code=200 if instance.is_ready() else 503)


def _boot_step(step: BootStep) -> dict[str, Any]:
    """One boot step for /health/ready; its parts (a vLLM engine's start) under `steps`."""
    shown: dict[str, Any] = {"step": step.name, "seconds": round(step.seconds, 3)}
    if step.steps:
        shown["steps"] = [{"step": p.name, "seconds": round(p.seconds, 3),
                           **({"detail": p.detail} if p.detail else {})} for p in step.steps]
    return shown


def _include_optional_routers(app: FastAPI, instance: Instance) -> None:
    """KServe v2 over HTTP and /metrics."""
    from podium.frontends.kserve_http import create_router as kserve_router
    from podium.frontends.pipeline_json import create_router as pipeline_router

    app.include_router(kserve_router(instance.repository, server_ready=instance.is_ready,
                                     limits=instance.config.kserve_limits))
    app.include_router(pipeline_router(instance.repository, server_ready=instance.is_ready,
                                       limits=instance.config.kserve_limits))
    app.include_router(metrics_router())
