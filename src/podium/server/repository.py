"""The model repository of one instance: loaded backends by name and version.

Requests take a lease on a backend (`async with repository.lease(name, version)`); unloading
removes the backend from routing first and waits for its leases to end, so in-flight requests
finish on the version they started on. `infer` / `infer_stream` are the one request path every
frontend uses: lease → check inputs → backend → statistics.

Packages the instance knows come from `scan_repository(DIR)` (`podium serve --repository DIR`);
`load_model(name, policy)` loads the versions a `VersionPolicy` picks among them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.backends import create_backend
from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.validation import check_inputs
from podium.errors import (
    BackendError,
    Conflict,
    InvalidArgument,
    NotFound,
    PackageError,
    PodiumError,
    Unavailable,
)
from podium.metrics import request_log
from podium.metrics.server import observe_load
from podium.package.manifest import MANIFEST_NAME
from podium.package.package import Package, open_package
from podium.server.model_stats import ModelStats


def scan_repository(directory: Path) -> list[Package]:
    """Packages in a repository directory: `DIR/*/podium.json`, `DIR/*/*/podium.json`
    (name/version layout) and `DIR/*.tar.gz`, sorted by name then version."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise PackageError(f"{directory}: the model repository must be a directory")
    locations = sorted({*directory.glob(f"*/{MANIFEST_NAME}"),
                        *directory.glob(f"*/*/{MANIFEST_NAME}")})
    packages = [open_package(path.parent) for path in locations]
    packages += [open_package(path) for path in sorted(directory.glob("*.tar.gz"))]
    seen: dict[str, Package] = {}
    for package in packages:
        if package.key in seen:
            first = seen[package.key].root
            raise PackageError(f"{directory}: {package.key} is packaged twice ({first} and "
                               f"{package.root}); remove one")
        seen[package.key] = package
    return sorted(packages, key=lambda p: (p.manifest.name, version_key(p.manifest.version)))


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's packaged versions to serve (Triton's `version_policy`)."""

    latest: int | None = 1
    """Serve the newest N versions (the default: only the newest)."""
    specific: tuple[str, ...] = ()
    """Serve exactly these versions (overrides `latest`)."""
    all: bool = False
    """Serve every packaged version."""

    @classmethod
    def parse(cls, data: dict[str, Any] | None) -> VersionPolicy:
        """From Triton's JSON: {"latest": {"num_versions": 2}} | {"specific": {"versions":
        ["1"]}} | {"all": {}}."""
        if not data:
            return cls()
        if not isinstance(data, dict) or len(data) != 1:
            raise InvalidArgument(f"version_policy={data!r} must have exactly one of latest, "
                                  "specific, all", param="version_policy")
        ((kind, body),) = data.items()
        body = body or {}
        if kind == "all":
            return cls(latest=None, all=True)
        if kind == "latest":
            num = body.get("num_versions", 1)
            if not isinstance(num, int) or num < 1:
                raise InvalidArgument(f"version_policy.latest.num_versions={num!r} must be an "
                                      "integer >= 1", param="version_policy")
            return cls(latest=num)
        if kind == "specific":
            versions = body.get("versions")
            if not isinstance(versions, list) or not versions:
                raise InvalidArgument(f"version_policy.specific.versions={versions!r} must be a "
                                      "non-empty list", param="version_policy")
            return cls(latest=None, specific=tuple(str(v) for v in versions))
        raise InvalidArgument(f"version_policy kind {kind!r} is unknown; use latest, specific "
                              "or all", param="version_policy")

    def select(self, versions: list[str]) -> list[str]:
        """The versions to serve among those packaged."""
        ordered = sorted(versions, key=version_key)
        if self.all:
            return ordered
        if self.specific:
            missing = [v for v in self.specific if v not in versions]
            if missing:
                raise NotFound(f"versions {missing} are not packaged (packaged: {ordered})",
                               param="version_policy")
            return [v for v in ordered if v in self.specific]
        return ordered[-(self.latest or 1):]


@dataclass
class ModelEntry:
    """A backend plus its serving state in this instance."""

    backend: Backend
    state: str = "LOADING"  # LOADING → READY → UNLOADING → UNAVAILABLE
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    loaded_at: float = 0.0
    reason: str = ""
    stats: ModelStats = field(default_factory=ModelStats)

    def __post_init__(self) -> None:
        self.idle.set()


class ModelRepository:
    """Loaded models of one instance; the only place that loads and unloads backends."""

    def __init__(self, root: Path | None = None) -> None:
        self._entries: dict[str, dict[str, ModelEntry]] = {}
        self.packages: dict[str, Package] = {}
        """Packages known to this instance by name@version (loaded or not)."""
        self.root = root
        """The `--repository` directory, rescanned when a model is loaded by name."""
        self._changes = asyncio.Lock()
        self._failures: dict[tuple[str, str], str] = {}
        """Why the last load of name@version failed, for the repository index."""

    def register(self, packages: list[Package]) -> None:
        """Make packages known (loadable by name) without loading them."""
        for package in packages:
            self.packages[package.key] = package

    # -- queries -----------------------------------------------------------------------------
    def entries(self) -> list[ModelEntry]:
        return [e for versions in self._entries.values() for e in versions.values()]

    def ready_entries(self) -> list[ModelEntry]:
        return [e for e in self.entries() if e.state == "READY"]

    def all_ready(self) -> bool:
        entries = self.entries()
        return bool(entries) and all(e.state == "READY" for e in entries)

    def find(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry for name@version; without a version, the latest READY one."""
        versions = self._entries.get(name)
        if not versions:
            known = ", ".join(sorted(self._entries)) or "none"
            raise NotFound(f"model {name!r} is not served here (models: {known})", param="model")
        if version is not None:
            entry = versions.get(version)
            if entry is None:
                raise NotFound(f"model {name!r} has no version {version!r} (versions: "
                               f"{', '.join(sorted(versions, key=version_key))})", param="model")
            return entry
        ready = [v for v, e in versions.items() if e.state == "READY"]
        if not ready:
            raise Unavailable(f"model {name!r} has no ready version yet")
        return versions[max(ready, key=version_key)]

    def get(self, name: str, version: str | None = None) -> Backend:
        return self.find(name, version).backend

    @asynccontextmanager
    async def lease(self, name: str, version: str | None = None) -> AsyncIterator[Backend]:
        """Use a READY backend for the span of one request."""
        entry = self.find(name, version)
        if entry.state != "READY":
            raise Unavailable(f"model {name!r} version {entry.backend.version} is "
                              f"{entry.state.lower()}, not ready")
        entry.in_flight += 1
        entry.idle.clear()
        request_log.annotate(model=entry.backend.name, version=entry.backend.version)
        try:
            yield entry.backend
        finally:
            entry.in_flight -= 1
            if entry.in_flight == 0:
                entry.idle.set()

    # -- changes -----------------------------------------------------------------------------
    async def load(self, package: Package, backend: Backend | None = None) -> ModelEntry:
        """Create and load the package's backend (or `backend`, built by the caller, e.g. one
        sharing an engine); it serves once loaded."""
        name, version = package.manifest.name, package.manifest.version
        existing = self._entries.get(name, {}).get(version)
        if existing is not None and existing.state in ("LOADING", "READY"):
            raise Conflict(f"model {name!r} version {version!r} is already "
                           f"{existing.state.lower()}")
        entry = ModelEntry(backend or create_backend(package))
        bind = getattr(entry.backend, "bind_repository", None)
        if bind is not None:  # python models call other models through the repository
            bind(self)
        self._entries.setdefault(name, {})[version] = entry
        self.packages[package.key] = package
        self._failures.pop((name, version), None)
        started = time.monotonic()
        try:
            await entry.backend.load()
        except BaseException as exc:
            observe_load(name, version, "load", time.monotonic() - started, ok=False)
            entry.state, entry.reason = "UNAVAILABLE", str(exc)
            # a failed version does not serve and must not hold the instance's readiness back;
            # the index keeps the reason
            self._entries[name].pop(version, None)
            if not self._entries[name]:
                self._entries.pop(name)
            self._failures[(name, version)] = str(exc) or type(exc).__name__
            if isinstance(exc, Exception) and not isinstance(exc, PodiumError):
                raise BackendError(f"loading {package.key} failed: {type(exc).__name__}: "
                                   f"{exc}") from exc
            raise
        entry.state, entry.loaded_at = "READY", time.time()
        observe_load(name, version, "load", time.monotonic() - started, ok=True)
        return entry

    async def unload(self, name: str, version: str | None = None,
                     timeout_s: float | None = None) -> list[ModelEntry]:
        """Stop routing to the model (one version or all), let in-flight requests finish,
        then release it."""
        versions = self._entries.get(name)
        if not versions:
            raise NotFound(f"model {name!r} is not loaded", param="model")
        targets = [self.find(name, version)] if version is not None else list(versions.values())
        for entry in targets:
            entry.state = "UNLOADING"
        for entry in targets:
            # the deadline wins over stragglers; their requests fail with 503
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.idle.wait(), timeout_s)
            started = time.monotonic()
            await entry.backend.unload()
            observe_load(entry.backend.name, entry.backend.version, "unload",
                         time.monotonic() - started, ok=True)
            entry.state = "UNAVAILABLE"
            versions.pop(entry.backend.version, None)
        if not versions:
            self._entries.pop(name, None)
        return targets

    async def load_model(self, name: str, policy: VersionPolicy | None = None
                         ) -> list[ModelEntry]:
        """Serve the packaged versions of `name` that `policy` picks (newest by default):
        load the missing ones, then unload served versions the policy no longer picks."""
        async with self._changes:
            if self.root is not None:
                self.register(scan_repository(self.root))
            packaged = {p.manifest.version: p for p in self.packages.values()
                        if p.manifest.name == name}
            if not packaged:
                known = sorted({p.manifest.name for p in self.packages.values()})
                raise NotFound(f"no package for model {name!r} in the repository (packaged: "
                               f"{', '.join(known) or 'none'})", param="model")
            wanted = (policy or VersionPolicy()).select(list(packaged))
            served = self._entries.get(name, {})
            for version in wanted:
                entry = served.get(version)
                if entry is None or entry.state not in ("LOADING", "READY"):
                    await self.load(packaged[version])
            for version in [v for v in list(served) if v not in wanted]:
                await self.unload(name, version)
            return [self._entries[name][v] for v in wanted]

    def index(self, *, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every packaged or served version with its state."""
        rows: dict[tuple[str, str], dict[str, str]] = {}
        for package in self.packages.values():
            key = (package.manifest.name, package.manifest.version)
            rows[key] = {"name": key[0], "version": key[1], "state": "UNAVAILABLE",
                         "reason": self._failures.get(key, "unloaded")}
        for entry in self.entries():
            key = (entry.backend.name, entry.backend.version)
            rows[key] = {"name": key[0], "version": key[1], "state": entry.state,
                         "reason": entry.reason}
        ordered = [rows[k] for k in sorted(rows, key=lambda k: (k[0], version_key(k[1])))]
        return [r for r in ordered if r["state"] == "READY"] if ready_only else ordered

    # -- the request path ------------------------------------------------------------------
    async def infer(self, name: str, version: str | None, request: InferenceRequest
                    ) -> InferenceResponse:
        """Score one request on name@version (latest ready without a version)."""
        async with self.lease(name, version) as backend:
            entry = self.find(name, backend.version)
            started = time.perf_counter_ns()
            ok = False
            try:
                _check(backend, request)
                response = await backend.infer(request)
                _select_outputs(backend, request, response)
                ok = True
                return response
            finally:
                entry.stats.record(ok=ok, duration_ns=time.perf_counter_ns() - started,
                                   batch_size=_batch_size(backend, request))

    async def infer_stream(self, name: str, version: str | None, request: InferenceRequest
                           ) -> AsyncIterator[InferenceResponse]:
        """Decoupled scoring: every response of the request, the last with `final` set."""
        async with self.lease(name, version) as backend:
            entry = self.find(name, backend.version)
            started = time.perf_counter_ns()
            ok = False
            try:
                _check(backend, request)
                async for response in backend.infer_stream(request):
                    _select_outputs(backend, request, response)
                    yield response
                ok = True
            finally:
                entry.stats.record(ok=ok, duration_ns=time.perf_counter_ns() - started,
                                   batch_size=_batch_size(backend, request))

    def statistics(self, name: str | None = None, version: str | None = None
                   ) -> list[dict[str, Any]]:
        """Triton's `model_stats` list: one model version, all versions of one, or all."""
        if name is None:
            entries = self.ready_entries()
        elif version is None:
            self.find(name)  # 404 for unknown models
            entries = [e for e in self.ready_entries() if e.backend.name == name]
        else:
            entries = [self.find(name, version)]
        rows = []
        for entry in sorted(entries, key=lambda e: (e.backend.name,
                                                      version_key(e.backend.version))):
            backend = entry.backend
            batch = getattr(backend, "batch_stats", None)
            rows.append(entry.stats.as_triton(
                backend.name, backend.version,
                execution_count=getattr(backend, "execution_count", None),
                batch_stats=batch() if batch is not None else None))
        return rows

    async def unload_all(self, timeout_s: float | None = None) -> None:
        for name in list(self._entries):
            await self.unload(name, timeout_s=timeout_s)


def version_key(version: str) -> tuple[int, int | str]:
    """Sort key: numeric versions in numeric order, before named ones."""
    return (0, int(version)) if version.isdigit() else (1, version)


def _check(backend: Backend, request: InferenceRequest) -> None:
    check_inputs(request, backend.inputs(), backend.max_batch_size,
                 optional=_optional_inputs(backend))
    if request.requested_outputs is not None:
        names = {spec.name for spec in backend.outputs()}
        for output in request.requested_outputs:
            if output not in names:
                raise InvalidArgument(f"requested output {output!r} is not an output of model "
                                      f"{backend.name!r} (outputs: {', '.join(sorted(names))})",
                                      param=output)


def _optional_inputs(backend: Backend) -> frozenset[str]:
    """Inputs a request may omit: the backend's `optional_inputs`, else for vLLM models the
    optional tensors of Triton's vLLM contract (stream, sampling_parameters, …)."""
    declared = getattr(backend, "optional_inputs", None)
    if declared is not None:
        return frozenset(declared)
    if backend.manifest.backend == "vllm":
        from podium.backends import vllm_contract

        return vllm_contract.optional_inputs(getattr(backend.manifest, "task", "generate"))
    return frozenset()


def _select_outputs(backend: Backend, request: InferenceRequest,
                    response: InferenceResponse) -> None:
    if request.requested_outputs is not None:
        wanted = set(request.requested_outputs)
        response.outputs = [t for t in response.outputs if t.name in wanted]


def _batch_size(backend: Backend, request: InferenceRequest) -> int:
    if backend.max_batch_size > 0 and request.inputs:
        shape = next(iter(request.inputs.values())).shape
        return shape[0] if shape else 1
    return 1
