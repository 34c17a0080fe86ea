"""The control plane as one object: store + rollout driver + the world it acts on.

The REST API, the CLI and `podium up` all go through these methods; each validates its input
fully before it changes anything, so a bad request leaves the store as it was.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC
from typing import Any

from podium.control import region_rollout
from podium.control.adapter_deploy import adapter_bases, carry_adapters
from podium.control.commit import World
from podium.control.driver import RolloutDriver
from podium.control.models import DeploymentRow, EventRow
from podium.control.rollout import LATEST, SUCCEEDED
from podium.control.rollout_config import RolloutConfig
from podium.control.store import RolloutRecord, Store
from podium.errors import Conflict, NotFound
from podium.package.adapter import adapter_of
from podium.package.package import Package, open_package

Clock = Callable[[], int]
log = logging.getLogger("podium.control")


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: rollout timers must survive a control-plane restart."""
    return int(time.time() * 1000)


def _store_adapter(adapter: Package, base: Package) -> object:
    from podium.package.adapter_base import store_adapter

    return store_adapter(adapter, base)


def _carry_adapter(adapter: Package, base: Package) -> object:
    from podium.package.adapter_carry import carry_adapter

    return carry_adapter(adapter, base)


def materialize_weights(package: Package) -> None:
    """Put an LLM package's weights into the model cache, and its compiled engine build where
    it runs compiled on this machine (classic packages need nothing)."""
    if package.manifest.backend == "vllm":
        from podium.backends.vllm import engine_build
        from podium.package.cache import ModelCache

        entry = ModelCache().materialize(package)
        log.info("%s: %s", package.key, engine_build.build(package, entry.path))


class ControlPlane:
    """Announce packages, start and roll back rollouts, report status; tick drives rollouts."""

    def __init__(self, store: Store, world: World, *, clock: Clock = wall_clock_ms,
                 materialize: Callable[[Package], None] = materialize_weights,
                 materialize_adapter: Callable[[Package, Package], object] | None = None,
                 carry_adapter: Callable[[Package, Package], object] = _carry_adapter
                 ) -> None:
        self.store = store
        self.world = world
        self.clock = clock
        self.materialize = materialize
        self.materialize_adapter = materialize_adapter or _store_adapter
        self.carry_adapter = carry_adapter
        """Stores an adapter for another version of its base (a base rollout carries it)."""
        self.driver = RolloutDriver(store, world)
        # API threads and the control loop thread take turns: one change at a time
        self.lock = threading.RLock()

    def announce(self, location: str) -> dict[str, Any]:
        """Validate a package, materialize its weights, then record it (in that order). A
        Triton model folder announces its numbered versions (`control/triton_announce.py`)."""
        from podium.control.triton_announce import announce_triton, triton_folder

        folder = triton_folder(location)
        if folder is not None:
            return announce_triton(self.store, folder, self.materialize)
        package = open_package(location)
        manifest = package.manifest
        if any(p.version == manifest.version for p in self.store.list_packages()
               if p.name == manifest.name):
            raise Conflict(f"{package.key} is already announced; bump the version in "
                           "podium.json", param="version")
        adapter = adapter_of(manifest)
        if adapter is not None:  # checked against its announced base, stored beside it
            self.materialize_adapter(package, self._announced_base(adapter.base_key))
        else:
            self.materialize(package)
        self.store.announce_package(manifest.name, manifest.version, manifest.backend,
                                    str(package.root), manifest.model_dump(mode="json"))
        return {"name": manifest.name, "version": manifest.version,
                "backend": manifest.backend, "location": str(package.root)}

    def _announced_base(self, base_key: str) -> Package:
        for row in self.store.list_packages():
            if f"{row.name}@{row.version}" == base_key:
                return open_package(row.location)
        raise NotFound(f"base={base_key!r} is not announced; announce the base package "
                       "first", param="base")

    def deploy(self, model: str, version: str, config: RolloutConfig) -> int:
        """Start a rollout of model@version; returns the rollout id."""
        with self.lock:
            carried = carry_adapters(self.store, model, version,
                                     list(config.regions or self.store.region_names()),
                                     self.carry_adapter)
            rollout_id = self.driver.start(model, version, config, self.clock())
            if carried:
                self.store.record_event("rollout", f"rollout {rollout_id}: {model}@{version} "
                                        f"carries {', '.join(carried)}", model)
            try:
                self.driver.tick(self.clock())  # take the first step now, not at the next pass
            except Exception as exc:
                # the rollout is stored and the loop retries the step: answering 500 here
                # would tell the caller nothing happened
                log.exception("rollout %d: first step failed; retried on the next pass",
                              rollout_id)
                self.driver.resync()
                self.store.record_event("rollout", f"rollout {rollout_id}: first step failed "
                                        f"({type(exc).__name__}: {exc}); retried on the next "
                                        "pass", model)
            return rollout_id

    def rollback(self, model: str) -> int:
        """Roll back the running rollout, or roll back to the version before the last one."""
        with self.lock:
            aborted = self.driver.abort(model, "by operator", self.clock())
            if aborted is not None:
                return aborted
        previous = self._previous_success(model)
        if previous is None or previous.state.leg.from_version is None:
            known = {d.model for d in self.store.list_deployments()}
            if model not in known:
                raise NotFound(f"model {model!r} has no deployment", param="model")
            raise Conflict(f"{model} has no running rollout and no earlier version to roll "
                           "back to", param="model")
        state = previous.state
        config = state.config
        return self.deploy(model, state.leg.from_version, config)

    def pause(self, rollout_id: int, *, by: str = "operator") -> RolloutRecord:
        """Hold a running rollout at its stage (no step, no analysis) until `resume`."""
        with self.lock:
            return self.driver.hold(rollout_id, True, by, self.clock())

    def resume(self, rollout_id: int, *, by: str = "operator") -> RolloutRecord:
        """Let a paused rollout continue where it stood."""
        with self.lock:
            return self.driver.hold(rollout_id, False, by, self.clock())

    def set_scaling(self, model: str, version: str, min_instances: int,
                    max_instances: int, *, region: str | None = None) -> DeploymentRow:
        """Change a deployment's bounds (in one region, or every region it lives in); a size
        pushed into them is written, then acted on."""
        with self.lock:
            regions = [region] if region else (
                list(dict.fromkeys(d.region for d in self.store.list_deployments(model)
                                   if d.version == version)) or [None])
            for name in regions:
                row = self.driver.commit.bounds(model, version, min_instances, max_instances,
                                                region=name)
            return row

    def tick(self) -> None:
        """Advance every running rollout by at most one step."""
        with self.lock:
            self.driver.tick(self.clock())

    def rollout(self, rollout_id: int) -> dict[str, Any]:
        """One rollout with its steps."""
        record = self.store.get_rollout(rollout_id)
        steps = self.store.rollout_steps(rollout_id)
        return {**rollout_summary(record),
                "steps": [{"seq": s.seq, "at_ms": s.at_ms, "phase": s.phase, "note": s.note,
                           "actions": s.actions} for s in steps]}

    def status(self) -> dict[str, Any]:
        """Per model and region: versions with instances, splits and aliases (the model's first
        region also at the top, as a single-region plane shows it), plus running rollouts. A
        LoRA adapter names its `base`, and a base lists its `adapters`. Read in a fixed handful
        of queries whatever the number of deployments."""
        deployments, split_rows, alias_rows, instances = self.store.routing_rows()
        order = {name: i for i, name in enumerate(self.store.region_names())}
        splits: dict[tuple[str, str], dict[str, int]] = {}
        for split in split_rows:
            splits.setdefault((split.model, split.region), {})[split.version] = split.weight
        aliases: dict[tuple[str, str], dict[str, str]] = {}
        for alias in alias_rows:
            aliases.setdefault((alias.model, alias.region), {})[alias.alias] = alias.version
        by_deployment: dict[int, list[dict[str, Any]]] = {}
        for _m, _v, i in instances:
            by_deployment.setdefault(i.deployment_id, []).append({
                "id": i.id, "state": i.state, "http_port": i.http_port,
                "grpc_port": i.grpc_port, "pid": i.pid, "num_restarts": i.num_restarts})
        models: dict[str, dict[str, Any]] = {}
        for dep in sorted(deployments,
                          key=lambda d: (d.model, order.get(d.region, len(order)), d.id)):
            regions = models.setdefault(dep.model, {"regions": {}})["regions"]
            entry = regions.get(dep.region)
            if entry is None:
                key = (dep.model, dep.region)
                entry = regions[dep.region] = {"splits": splits.get(key, {}),
                                               "aliases": aliases.get(key, {}), "versions": {}}
            entry["versions"][dep.version] = {
                "strategy": dep.strategy, "state": dep.state, "num_desired": dep.num_desired,
                "min_instances": dep.min_instances, "max_instances": dep.max_instances,
                "instances": by_deployment.get(dep.id, [])}
        for entry in models.values():
            entry.update(next(iter(entry["regions"].values())))
        for name, base in adapter_bases(self.store).items():
            if name in models:  # shown under its base: it runs on the base's instances
                models[name]["base"] = base
                if base in models:
                    models[base].setdefault("adapters", []).append(name)
        running = [rollout_summary(r) for r in self.store.list_rollouts(status="running")]
        return {"models": models, "rollouts": running}

    def _previous_success(self, model: str) -> RolloutRecord | None:
        for record in self.store.list_rollouts(model):
            if record.status == SUCCEEDED and record.state.config.strategy == "red-black":
                return record
        return None


def event_summary(row: EventRow) -> dict[str, Any]:
    """The public shape of an event (API and CLI)."""
    at = row.at if row.at.tzinfo else row.at.replace(tzinfo=UTC)  # SQLite drops the zone
    return {"id": row.id, "at": at.isoformat(), "kind": row.kind, "model": row.model,
            "message": row.message}


def rollout_summary(record: RolloutRecord) -> dict[str, Any]:
    """The public shape of a rollout (API and CLI)."""
    state, leg = record.state, record.state.leg
    return {"id": record.id, "model": state.model, "from_version": leg.from_version,
            "to_version": state.to_version, "strategy": state.config.strategy,
            "status": record.status, "phase": state.phase, "weight_new": leg.weight_new,
            "stage": f"{leg.stage_index + 1}/{len(state.config.stages)}",
            "reason": record.reason, "num_steps": record.num_steps,
            "paused_since_ms": state.paused_since_ms,
            "config": state.config.to_dict(), LATEST: leg.latest, "region": state.region,
            "regions": region_rollout.progress(state)}
