"""The control-plane REST API (FastAPI, OpenAPI at /docs and /openapi.json; port 8080).

Request bodies are strict pydantic models: an unknown field, a wrong type (`true` is not a
count, `"2"` is not a number) or a value out of range is a 400 naming it, and nothing is
changed. `api_limits` refuses oversized, compressed, non-UTF-8 and deeply nested bodies before
any route runs. Every error is `{"error": {"message", "type", "param", "code"}}` (the OpenAI
shape, `code` the HTTP status, `param` the offending field or null), rendered by
`podium.errors.render.control_body` with the status of its `podium.errors` class.
"""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from podium.auth import ApiKeyMiddleware, admin_role
from podium.auth_keys import ADMIN, Access
from podium.console import mount_console
from podium.control.api_limits import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_PATH_CHARS,
    RequestLimits,
    checked_package_path,
)
from podium.control.plane import ControlPlane, event_summary, rollout_summary
from podium.control.rollout_config import RolloutConfig
from podium.errors import InvalidArgument, PodiumError
from podium.errors.http import error_response, install_error_handlers

NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
VERSION = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$"
MAX_ID = 2**31 - 1  # ids are 32-bit INTEGER columns on PostgreSQL
MAX_EVENTS = 1000
ModelName = Annotated[str, Path(pattern=NAME, max_length=63, description="Model name.")]
VersionName = Annotated[str, Path(pattern=VERSION, max_length=63, description="Model version.")]
RolloutId = Annotated[int, Path(ge=1, le=MAX_ID, description="Rollout id.")]
ModelFilter = Annotated[str | None, Query(pattern=NAME, max_length=63,
                                          description="Only this model.")]


class _Strict(BaseModel):
    # strict: JSON `true` is not the count 1, `"2"` is not the number 2
    model_config = ConfigDict(extra="forbid", strict=True)


class AnnounceRequest(_Strict):
    """Register a package directory or .tar.gz found on the control plane's machine."""

    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS,
                      description="Absolute path of a package directory or .tar.gz.")


class DeployRequest(_Strict):
    """Roll model@version out with a strategy."""

    model: str = Field(pattern=NAME, description="Model name.")
    version: str = Field(pattern=VERSION, description="Version to roll out (announced).")
    strategy: Literal["red-black", "versioned"] = "red-black"
    stages: list[int] | None = Field(default=None, max_length=100,
                                     description="Red-Black stages in percent.")
    num_instances: int | None = Field(default=None, description="Instances at 100% (1-64).")
    ready_timeout_ms: int | None = None
    analysis_window_ms: int | None = None
    min_requests: int | None = None
    evidence_wait_ms: int | None = None
    max_error_rate_increase: float | None = None
    max_p99_ratio: float | None = None
    p99_slack_ms: float | None = None
    latency_checks: int | None = None
    warm_delay_ms: int | None = None
    regions: list[str] | None = Field(default=None, max_length=64, description=(
        "Regions to roll out to, in this order (default: every declared region)."))
    bake_ms: int | None = Field(default=None, description=(
        "Between regions: how long a finished region bakes before the next starts."))
    region_failure: Literal["roll-back-all", "keep-earlier"] | None = Field(
        default=None, description="When a region fails: roll the earlier ones back too "
                                  "(default) or let them keep the new version.")

    def config(self) -> RolloutConfig:
        """The validated rollout config (InvalidArgument names a bad field)."""
        given = self.model_dump(exclude={"model", "version"}, exclude_none=True)
        for key in ("stages", "regions"):
            if key in given:
                given[key] = tuple(given[key])
        return RolloutConfig(**given)


class ScalingRequest(_Strict):
    """Autoscaling bounds of one deployment."""

    min_instances: int = Field(description="0..64")
    max_instances: int = Field(description="min_instances..64")
    region: str | None = Field(default=None, pattern=NAME, description=(
        "Only this region (default: every region the deployment lives in)."))


def create_app(plane: ControlPlane, *, api_key: str | None = None,
               access: Access | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               package_roots: tuple[FilePath, ...] = ()) -> FastAPI:
    """The API app over one control plane; with `api_key` or `access` (its admin keys), every
    route but /health needs `Authorization: Bearer <key>`; with `package_roots`, only packages
    under them announce."""
    app = FastAPI(title="Podium control plane", version="1",
                  description="Announce packages, deploy with Red-Black or Versioned rollouts, "
                              "roll back, and read status and events.",
                  dependencies=[Depends(_known_query)])
    _install_errors(app)
    # the request head is bounded by the HTTP protocol `podium up` serves this app with
    app.add_middleware(RequestLimits, max_body_bytes=max_body_bytes, render=control_error)
    access = Access.single(api_key) if api_key else access
    if access is not None and access.roles.get(ADMIN) is not None:
        app.add_middleware(ApiKeyMiddleware, access=access, role_of=admin_role,
                           shape_of=lambda _path: "control")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/packages", status_code=201)
    def announce(body: AnnounceRequest) -> dict[str, Any]:
        return plane.announce(checked_package_path(body.path, package_roots))

    @app.get("/v1/packages")
    def packages() -> list[dict[str, Any]]:
        return [{"name": p.name, "version": p.version, "backend": p.backend,
                 "location": p.location} for p in plane.store.list_packages()]

    @app.get("/v1/deployments")
    def deployments() -> dict[str, Any]:
        return plane.status()["models"]

    @app.put("/v1/deployments/{model}/{version}/scaling")
    def scaling(model: ModelName, version: VersionName, body: ScalingRequest) -> dict[str, Any]:
        row = plane.set_scaling(model, version, body.min_instances, body.max_instances,
                                region=body.region)
        return {"model": model, "version": version, "min_instances": row.min_instances,
                "max_instances": row.max_instances, "num_desired": row.num_desired,
                "region": row.region}

    @app.get("/v1/regions")
    def regions() -> list[dict[str, Any]]:
        """The declared regions in rollout order (one `default` when none is declared)."""
        declared = plane.store.list_regions()
        if not declared:
            return [{"name": "default", "position": 0}]
        return [{"name": r.name, "position": r.position, "runtime": r.runtime,
                 "ray_address": r.ray_address, "http_port": r.http_port,
                 "grpc_port": r.grpc_port} for r in declared]

    @app.post("/v1/rollouts", status_code=201)
    def deploy(body: DeployRequest) -> dict[str, Any]:
        config = body.config()  # validated before anything is written
        rollout_id = plane.deploy(body.model, body.version, config)
        return rollout_summary(plane.store.get_rollout(rollout_id))

    @app.get("/v1/rollouts")
    def rollouts(model: ModelFilter = None,
                 status: Annotated[Literal["running", "succeeded", "rolled_back", "failed"]
                                   | None, Query()] = None) -> list[dict[str, Any]]:
        return [rollout_summary(r) for r in plane.store.list_rollouts(model, status=status)]

    @app.get("/v1/rollouts/{rollout_id}")
    def rollout(rollout_id: RolloutId) -> dict[str, Any]:
        return plane.rollout(rollout_id)

    @app.post("/v1/rollouts/{rollout_id}/pause")
    def pause(rollout_id: RolloutId) -> dict[str, Any]:
        """Hold a running rollout at its current stage: no step, no analysis until resumed."""
        return rollout_summary(plane.pause(rollout_id))

    @app.post("/v1/rollouts/{rollout_id}/resume")
    def resume(rollout_id: RolloutId) -> dict[str, Any]:
        """Continue a paused rollout where it stood (its timers moved on by the pause)."""
        return rollout_summary(plane.resume(rollout_id))

    @app.post("/v1/models/{model}/rollback")
    def rollback(model: ModelName) -> dict[str, Any]:
        return rollout_summary(plane.store.get_rollout(plane.rollback(model)))

    @app.get("/v1/status")
    def status() -> dict[str, Any]:
        return plane.status()

    @app.get("/v1/events")
    def events(model: ModelFilter = None,
               limit: Annotated[int, Query(ge=1, le=MAX_EVENTS,
                                           description="At most this many.")] = 100,
               before: Annotated[int | None, Query(ge=1, le=MAX_ID, description=(
                   "Only events older than this id (the last id of the previous page)."))]
               = None) -> list[dict[str, Any]]:
        """Announcements, rollout steps, scaling and instance events, newest first."""
        return [event_summary(e)
                for e in plane.store.list_events(model, limit=limit, before=before)]

    mount_console(app)  # the web console at /console (its files; it reads the routes above)
    return app


def _known_query(request: Request) -> None:
    """A misspelt query parameter is a 400 naming it, not silently ignored."""
    route = request.scope.get("route")
    known = {p.alias for p in route.dependant.query_params} if isinstance(
        route, APIRoute) else set()
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        hint = f"use {', '.join(sorted(known))}" if known else "this route takes none"
        raise InvalidArgument(f"query parameter {unknown[0][:60]!r} is not known; {hint}",
                              param=unknown[0][:60])


def control_error(exc: PodiumError) -> Response:
    """The API's error body for a PodiumError (routes and `RequestLimits` alike)."""
    return error_response("control", exc)


def _install_errors(app: FastAPI) -> None:
    install_error_handlers(app, lambda _path: "control")

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> Response:
        problems = []
        for err in exc.errors():
            loc = _field(err["loc"])
            msg = {"extra_forbidden": "is not a known field; remove it",
                   "missing": "is required"}.get(err["type"], err["msg"])
            got = "" if err["type"] in ("missing", "extra_forbidden") else (
                f" (got {_shown(err.get('input'))})")
            problems.append(f"{loc or 'body'}: {msg}{got}")
        first = exc.errors()[0]["loc"] if exc.errors() else ()
        param = _field(first) or None
        return error_response("control", InvalidArgument("; ".join(problems), param=param))


def _shown(value: Any) -> str:
    """The offending value, cut short: a 4 KiB string need not come back whole."""
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:100]}... ({len(text)} characters)"


def _field(loc: tuple | list) -> str:
    """`body.stages.1` → `stages.1`: the field as the client named it."""
    parts = list(loc)
    if parts and parts[0] in ("body", "path", "query"):
        parts = parts[1:]
    return ".".join(str(p) for p in parts)
