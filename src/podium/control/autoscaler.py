"""The autoscaler's pass: observe each deployment's load → decide (`autoscale.decide`) → commit.

Runs inside the control loop's pass, under the plane's lock. A deployment is autoscaled when
its bounds leave room (`min_instances < max_instances`), it wants instances, and no rollout of
its model is running (a rollout owns its sizes). Its targets are the control plane's defaults,
overridden by its package's `autoscale` section; in-flight requests come from the gateway's
route table, the engine signals from the runtime (only for a package that declares an engine
target, so nobody else's /metrics is scraped).

A deployment with `min_instances: 0` scales to zero once idle (no request in flight or held
for `scale_down_cooldown_ms`: its idle timeout) and back from zero on the requests the
gateways hold for it (`gateway.hold`; counted with the in-flight ones). It is marked in the
route table as started on demand, so the gateways hold its requests rather than answer 503.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from podium.control.autoscale import (
    DEFAULT_TARGETS,
    AutoscalePolicy,
    AutoscaleState,
    Demand,
    Deployment,
    Targets,
    decide,
)
from podium.control.commit import Commit
from podium.control.models import DeploymentRow
from podium.control.runtime.base import STARTING
from podium.control.store import Store, StoreUnavailable
from podium.errors import NotFound

if TYPE_CHECKING:
    from podium.control.region_world import Region

class Autoscaler:
    """Keeps each autoscaled deployment's policy state between passes."""

    def __init__(self, store: Store, regions: Mapping[str, Region], commit: Commit,
                 defaults: Targets = DEFAULT_TARGETS) -> None:
        self.store = store
        self.regions = regions
        """Each region's runtime and route table, by name (a deployment is scaled in its own)."""
        self.commit = commit
        """Writes, then carries out, each new size."""
        self.defaults = defaults
        self._states: dict[tuple[str, str, str], AutoscaleState] = {}
        self._targets: dict[tuple[str, str], dict[str, Any]] = {}
        """Per model@version, its package's `autoscale` section (packages never change)."""

    def step(self, now_ms: int, busy: set[str]) -> None:
        """One decision per autoscaled deployment; models in `busy` have a rollout running."""
        for dep in self.store.list_deployments():
            key = (dep.region, dep.model, dep.version)
            region = self.regions.get(dep.region)
            if region is not None:
                _mark_on_demand(region, dep)
            at_rest = dep.num_desired == 0 and dep.min_instances > 0  # stopped, not at zero
            if (region is None or dep.model in busy or at_rest
                    or dep.min_instances >= dep.max_instances):
                self._states.pop(key, None)  # when it is autoscaled again, start from its size
                continue
            policy = self._policy(dep)
            state = self._states.get(key) or AutoscaleState(dep.num_desired, now_ms)
            if state.num_instances != dep.num_desired:  # resized by someone else meanwhile
                state = AutoscaleState(dep.num_desired, now_ms)
            decision = decide(policy, state, self._demand(dep, policy, region), now_ms,
                              Deployment(dep.model, dep.version, dep.region))
            self._states[key] = decision.state
            for action in decision.actions:
                self.commit.scale(action, decision.note)

    def _policy(self, dep: DeploymentRow) -> AutoscalePolicy:
        declared = {k: v for k, v in self._declared(dep.model, dep.version).items()
                    if v is not None}
        return AutoscalePolicy(
            min_instances=dep.min_instances, max_instances=dep.max_instances,
            target_in_flight=declared.get("target_in_flight", self.defaults.target_in_flight),
            target_waiting=declared.get("target_waiting"),
            max_kv_cache_usage=declared.get("max_kv_cache_usage"),
            scale_up_window_ms=declared.get("scale_up_window_ms",
                                            self.defaults.scale_up_window_ms),
            scale_down_cooldown_ms=declared.get("scale_down_cooldown_ms",
                                                self.defaults.scale_down_cooldown_ms))

    def _declared(self, model: str, version: str) -> dict[str, Any]:
        key = (model, version)
        if key not in self._targets:
            try:
                manifest = self.store.get_package(model, version).manifest
            except NotFound:  # deployed without a package record (tests, a forgotten one)
                manifest = {}
            except StoreUnavailable:
                return {}  # not kept: read again once the database answers
            self._targets[key] = dict(manifest.get("autoscale") or {})
        return self._targets[key]

    def _demand(self, dep: DeploymentRow, policy: AutoscalePolicy, region: Region) -> Demand:
        in_flight = sum(e.num_in_flight for m, v, e in region.table.routed()
                        if (m, v) == (dep.model, dep.version))
        # requests the gateways hold for it: the demand of a deployment at zero
        in_flight += region.table.held.get((dep.model, dep.version), 0)
        num_starting = sum(1 for i in region.runtime.instances(dep.model, dep.version)
                           if i.state == STARTING)
        if not policy.reads_engine:
            return Demand(in_flight=in_flight, num_starting=num_starting)
        signals = region.runtime.engine_signals(dep.model, dep.version)
        return Demand(in_flight=in_flight, waiting=signals.waiting,
                      kv_cache_usage=signals.kv_cache_usage, complete=signals.complete,
                      num_starting=num_starting)


def _mark_on_demand(region: Region, dep: DeploymentRow) -> None:
    """Publish whether the deployment starts on demand (`min_instances` 0, room to grow): the
    gateways then hold its requests while it is at zero instead of answering 503."""
    on = dep.min_instances == 0 < dep.max_instances
    if on != (dep.version in region.table.on_demand().get(dep.model, [])):
        region.table.set_on_demand(dep.model, dep.version, on)
