"""The model repository of one instance: loaded backends by name and version.

A request takes a lease (`async with repository.lease(name, version) as entry`): one lookup
resolves the version (the latest ready one when none is given) and holds the entry until the
request ends. Unloading removes the entry from routing first and waits for its leases, so
in-flight requests finish on the version they started on.

A dead engine is handled in one place, `report_dead`: the entry stops serving (readiness turns
false) and `on_dead` tells the instance, which exits so a supervisor starts a fresh one. It is
reached from a lease whose request raised `BackendDead` and from `check_alive`, the poll of
every ready backend's `is_alive()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from podium.backends import create_backend
from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.limits import InstanceLimits
from podium.errors import (
    BackendDead,
    BackendError,
    Conflict,
    NotFound,
    PackageError,
    PodiumError,
    Unavailable,
)
from podium.metrics import request_log
from podium.metrics.server import observe_load
from podium.model_control import ModelControl
from podium.package.package import Package
from podium.repository import inference
from podium.repository.entry import LOADING, READY, UNAVAILABLE, UNLOADING, ModelEntry
from podium.repository.load_request import LoadRequest, check_override_target, override_packages
from podium.repository.policy import VersionPolicy, version_key
from podium.repository.scan import scan_repository
from podium.triton.package import TritonPackage

log = logging.getLogger("podium.repository")

RequestFor = inference.RequestFor


class ModelRepository:
    """Loaded models of one instance; the only place that loads and unloads backends."""

    def __init__(self, root: Path | None = None) -> None:
        self._entries: dict[str, dict[str, ModelEntry]] = {}
        self.packages: dict[str, Package] = {}
        """Packages known to this instance by name@version (loaded or not)."""
        self.root = root
        """The `--repository` directory, rescanned when a model is loaded by name."""
        self.on_dead: Callable[[ModelEntry], None] | None = None
        """Called once per entry whose engine died (the instance stops)."""
        self.limits = InstanceLimits()
        """The instance's queue bounds and request caps, handed to every backend it loads."""
        self._changes = asyncio.Lock()
        self._failures: dict[tuple[str, str], str] = {}
        """Why the last load of name@version failed, for the repository index."""
        self._adapters: dict[tuple[str, str], ModelEntry] = {}
        """LoRA adapter entries by (base key, adapter key): their statistics accumulate."""
        self.control = ModelControl()
        """The model control mode: what loads at start, whether the API may load/unload."""
        self._overridden: set[str] = set()
        """Triton models served under a load request's config (not their config.pbtxt)."""
        self._load_dirs: dict[str, Path] = {}
        """Model folders written from a load request's files, by model (removed when replaced)."""

    def register(self, packages: list[Package]) -> None:
        """Make packages known (loadable by name) without loading them."""
        for package in packages:
            self.packages[package.key] = package

    def note_failures(self, failures: dict[tuple[str, str], str]) -> None:
        """Models found unservable before any load (a Triton config refused), for the index:
        (name, version or "") → reason."""
        self._failures.update(failures)

    # -- queries -----------------------------------------------------------------------------
    def entries(self) -> list[ModelEntry]:
        return [e for versions in self._entries.values() for e in versions.values()]

    def ready_entries(self) -> list[ModelEntry]:
        return [e for e in self.entries() if e.ready]

    def all_ready(self) -> bool:
        self.check_alive()
        entries = self.entries()
        if not entries:
            return self.control.ready_when_empty
        return all(e.ready for e in entries)

    def has_model(self, name: str, version: str | None = None) -> bool:
        """Whether name (@version) is packaged or served here, loaded yet or not (a pipeline
        checks the models it calls while they may still be loading)."""
        if any(p.manifest.name == name and version in (None, p.manifest.version)
               for p in self.packages.values()):
            return True
        return version in self._entries.get(name, {}) if version else name in self._entries

    def versions(self, name: str) -> list[str]:
        """The ready versions of `name`, oldest first."""
        return sorted((e.version for e in self.ready_entries() if e.name == name),
                      key=version_key)

    def find(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry for name@version; without a version, the latest READY one."""
        self.check_alive()  # a died engine or batcher stops serving now, not at the next poll
        versions = self._entries.get(name)
        if not versions:
            adapter = self._adapter_entry(name, version)
            if adapter is not None:
                return adapter
            # Triton's words first: tritonclient code matches "Request for unknown model"
            known = ", ".join(sorted(self._entries)) or "none"
            what = f"{name}@{version}" if version is not None else name
            triton = f"{name!r}" + (f" version {version}" if version is not None else "")
            raise NotFound(f"Request for unknown model: {triton} is not found (model {what!r} "
                           f"is not served here: no model or LoRA adapter of that name; "
                           f"models: {known})", param="model")
        if version is not None:
            entry = versions.get(version)
            if entry is None:
                raise NotFound(f"Request for unknown model: {name!r} version {version} is not "
                               f"found (model {name!r} has no version {version!r}; versions: "
                               f"{', '.join(sorted(versions, key=version_key))})", param="model")
            return entry
        ready = [v for v, e in versions.items() if e.ready]
        if not ready:
            raise Unavailable(f"Request for unknown model: {name!r} has no available versions "
                              f"(model {name!r} has no ready version yet)")
        return versions[max(ready, key=version_key)]

    def _adapter_entry(self, name: str, version: str | None) -> ModelEntry | None:
        """The entry of LoRA adapter name[@version] on a ready model that serves it."""
        for base in self.ready_entries():
            view = base.backend.adapter(name, version)
            if view is None:
                continue
            key = (base.key, f"{view.name}@{view.version}")
            entry = self._adapters.get(key)
            if entry is None or entry.backend is not view:
                entry = ModelEntry(view, state=READY, loaded_at=base.loaded_at, parent=base)
                self._adapters[key] = entry
            return entry
        return None

    @asynccontextmanager
    async def lease(self, name: str, version: str | None = None) -> AsyncIterator[ModelEntry]:
        """Hold a READY entry (version resolved) for the span of one request."""
        entry = self.find(name, version)
        if not entry.ready:
            raise Unavailable(f"model {name!r} version {entry.version} is "
                              f"{entry.state.lower()}, not ready")
        entry.acquire()
        request_log.annotate(model=entry.name, version=entry.version)
        try:
            yield entry
        except BackendDead as exc:
            self.report_dead(entry.parent or entry, exc.message)
            raise
        finally:
            entry.release()

    # -- the request path ------------------------------------------------------------------
    async def infer(self, name: str, version: str | None,
                    request: InferenceRequest | RequestFor) -> InferenceResponse:
        """Score one request on name@version (latest ready without a version)."""
        async with self.lease(name, version) as entry:
            return await inference.infer(entry, request)

    async def infer_stream(self, name: str, version: str | None,
                           request: InferenceRequest | RequestFor
                           ) -> AsyncIterator[InferenceResponse]:
        """Decoupled scoring: every response of the request, the last with `final` set."""
        async with self.lease(name, version) as entry:
            async for response in inference.infer_stream(entry, request):
                yield response

    def statistics(self, name: str | None = None, version: str | None = None
                   ) -> list[dict[str, Any]]:
        """Triton's `model_stats` list: one model version, all versions of one, or all."""
        if name is None:
            entries = self.ready_entries()
        elif version is None:
            self.find(name)  # 404 for unknown models
            entries = [e for e in self.ready_entries() if e.name == name]
        else:
            entries = [self.find(name, version)]
        ordered = sorted(entries, key=lambda e: (e.name, version_key(e.version)))
        return [inference.statistics_row(entry) for entry in ordered]

    def index(self, *, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every packaged or served version with its state."""
        self.check_alive()
        rows: dict[tuple[str, str], dict[str, str]] = {
            key: {"name": key[0], "version": key[1], "state": UNAVAILABLE, "reason": reason}
            for key, reason in self._failures.items() if not key[1]}
        for package in self.packages.values():
            key = (package.manifest.name, package.manifest.version)
            rows[key] = {"name": key[0], "version": key[1], "state": UNAVAILABLE,
                         "reason": self._failures.get(key, "unloaded")}
        for entry in self.entries():
            key = (entry.name, entry.version)
            rows[key] = {"name": key[0], "version": key[1], "state": entry.state,
                         "reason": entry.reason}
        ordered = [rows[k] for k in sorted(rows, key=lambda k: (k[0], version_key(k[1])))]
        return [r for r in ordered if r["state"] == READY] if ready_only else ordered

    # -- a dead engine ---------------------------------------------------------------------
    def report_dead(self, entry: ModelEntry, reason: str) -> None:
        """The entry's engine is gone for good: stop serving it and tell the instance."""
        if entry.state != READY:
            return  # already reported, or unloading (an engine shutting down is not dead)
        entry.state, entry.reason = UNAVAILABLE, f"engine died: {reason}"
        log.error("the engine of %s died: %s", entry.key, reason)
        if self.on_dead is not None:
            self.on_dead(entry)

    def check_alive(self) -> list[ModelEntry]:
        """Poll every ready backend; report (and return) those whose engine died."""
        dead = [e for e in self.ready_entries() if not e.backend.is_alive()]
        for entry in dead:
            self.report_dead(entry, "is_alive() turned false")
        return dead

    # -- changes -----------------------------------------------------------------------------
    async def load(self, package: Package, backend: Backend | None = None) -> ModelEntry:
        """Create and load the package's backend (or `backend`, built by the caller, e.g. one
        sharing an engine); it serves once loaded."""
        name, version = package.manifest.name, package.manifest.version
        existing = self._entries.get(name, {}).get(version)
        if existing is not None and existing.state in (LOADING, READY):
            raise Conflict(f"model {name!r} version {version!r} is already "
                           f"{existing.state.lower()}")
        entry = ModelEntry(backend or create_backend(package))
        entry.backend.bind_repository(self)  # python models call other models through it
        entry.backend.limits = self.limits
        self._entries.setdefault(name, {})[version] = entry
        self.packages[package.key] = package
        self._failures.pop((name, version), None)
        started = time.monotonic()
        try:
            await entry.backend.load()
        except BaseException as exc:
            observe_load(name, version, "load", time.monotonic() - started, ok=False)
            entry.state, entry.reason = UNAVAILABLE, str(exc)
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
        entry.state, entry.loaded_at = READY, time.time()
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
            entry.state = UNLOADING
        for entry in targets:
            # the deadline wins over stragglers; their requests fail with 503
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.idle.wait(), timeout_s)
            started = time.monotonic()
            await entry.backend.unload()
            observe_load(entry.name, entry.version, "unload", time.monotonic() - started,
                         ok=True)
            entry.state = UNAVAILABLE
            versions.pop(entry.version, None)
        if not versions:
            self._entries.pop(name, None)
        return targets

    async def load_over_api(self, name: str, request: LoadRequest) -> list[ModelEntry]:
        """A load request of the repository API: allowed by the model control mode?"""
        self.control.check_api("load", name)
        return await self.load_model(name, request.policy, config=request.config,
                                     files=request.files)

    async def unload_over_api(self, name: str) -> list[ModelEntry]:
        """An unload request of the repository API: allowed by the model control mode?"""
        self.control.check_api("unload", name)
        return await self.unload(name)

    async def load_model(self, name: str, policy: VersionPolicy | None = None, *,
                         config: dict[str, Any] | None = None,
                         files: dict[str, bytes] | None = None) -> list[ModelEntry]:
        """Serve the packaged versions of `name` that `policy` picks (newest by default):
        load the missing ones, then unload served versions the policy no longer picks.
        `config` replaces a Triton model's config.pbtxt (the served versions reload), and
        `files` its folder."""
        async with self._changes:
            if self.root is not None:
                for key in [k for k in self._failures if not k[1]]:
                    self._failures.pop(key)  # a rescan finds them again, or finds them fixed
                scanned = scan_repository(self.root, self._failures)
                self._drop_stale(name, {p.key for p in scanned})
                self.register(scanned)
            packaged = {p.manifest.version: p for p in self.packages.values()
                        if p.manifest.name == name}
            if not packaged and (name, "") in self._failures:
                raise PackageError(self._failures[(name, "")], param="model")
            if not packaged:
                known = sorted({p.manifest.name for p in self.packages.values()})
                raise NotFound(f"Request for unknown model: {name!r} is not found (no package "
                               f"for model {name!r} in the repository; packaged: "
                               f"{', '.join(known) or 'none'})", param="model")
            if config is not None or name in self._overridden:
                packaged = await self._reconfigure(name, list(packaged.values()), config,
                                                   files or {})
                policy = None
            if policy is None and all(isinstance(p, TritonPackage) for p in packaged.values()):
                policy = VersionPolicy(latest=None, all=True)  # the config's policy chose them
            wanted = (policy or VersionPolicy()).select(list(packaged))
            served = self._entries.get(name, {})
            for version in wanted:
                entry = served.get(version)
                if entry is None or entry.state not in (LOADING, READY):
                    await self.load(packaged[version])
            for version in [v for v in list(served) if v not in wanted]:
                await self.unload(name, version)
            return [self._entries[name][v] for v in wanted]

    async def _reconfigure(self, name: str, packaged: list[Package],
                           config: dict[str, Any] | None, files: dict[str, bytes]
                           ) -> dict[str, Package]:
        """Serve `name` under a load request's config, or back under its config.pbtxt: the
        new packages are checked before any served version is unloaded."""
        if config is not None:
            root = check_override_target(name, packaged, config)
            packages: list[Package] = list(override_packages(root, name, config, files))
            self._overridden.add(name)
        else:
            packages = packaged  # the rescan read config.pbtxt again
            self._overridden.discard(name)
        if name in self._entries:
            await self.unload(name)  # its config changes: every served version reloads
        old = self._load_dirs.pop(name, None)
        if old is not None:  # the folder a former load's files were written to
            shutil.rmtree(old.parent, ignore_errors=True)
        if files:
            self._load_dirs[name] = packages[0].root
        for key in [k for k, p in self.packages.items() if p.manifest.name == name]:
            self.packages.pop(key)
        self.register(packages)
        return {p.manifest.version: p for p in packages}

    def _drop_stale(self, name: str, scanned: set[str]) -> None:
        """Forget the Triton versions of `name` in the repository folder that its rescan no
        longer finds (a version folder removed, or no longer picked by version_policy)."""
        for key, package in list(self.packages.items()):
            if (package.manifest.name == name and isinstance(package, TritonPackage)
                    and key not in scanned):
                self.packages.pop(key)

    def is_served(self, name: str) -> bool:
        """Whether any version of `name` is loaded (or loading, or unloading) here."""
        return name in self._entries

    async def forget(self, name: str) -> None:
        """Unload `name` and drop its packages and failures: its folder is gone (poll)."""
        if name in self._entries:
            await self.unload(name)
        for key in [k for k, p in self.packages.items() if p.manifest.name == name]:
            self.packages.pop(key)
        for key in [k for k in self._failures if k[0] == name]:
            self._failures.pop(key)

    async def unload_all(self, timeout_s: float | None = None) -> None:
        for name in list(self._entries):
            await self.unload(name, timeout_s=timeout_s)

