"""What every runtime does to its instances, whatever starts the processes.

`poll()` is the whole loop, called every second or so by the control plane: per instance it
observes (exit status, `GET /health/ready`, requests in flight), asks the pure lifecycle
(`runtime.lifecycle.step`: a started instance becomes ready when its probe answers 200, then the
gateway routes to it; one whose process exits unasked is a crash, counted, then restarted; a
draining one is stopped once the gateway shows no request in flight on it, or after
`drain_timeout_s`) and carries out its effects. A runtime subclass only says how to launch a
process, whether it still runs, and how to signal and release it.

The database may be away (`StoreUnavailable`): an instance's observed state (ready, draining,
stopped) and its events are then kept and written at the next pass that reaches it, so routing
and drains go on; starting or restarting one waits for the database, since an instance is
recorded before its process may run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from podium.control.engine_signals import SignalReader, VersionSignals
from podium.control.models import PackageRow
from podium.control.runtime import lifecycle
from podium.control.runtime.base import (
    DRAINING,
    FAILED,
    READY,
    STARTING,
    STOPPED,
    InstanceView,
)
from podium.control.store import Store, StoreUnavailable
from podium.credential import bearer
from podium.errors import NotFound
from podium.routes.table import Endpoint, RouteTable, declared_bound


@dataclass
class Instance:
    """One instance as its runtime tracks it; subclasses add the process handle."""

    id: str
    model: str
    version: str
    db_id: int
    url: str = ""
    """Where it serves HTTP; empty until the runtime knows (a Ray actor not placed yet)."""
    grpc_target: str | None = None
    pid: int | None = None
    log_path: str | None = None
    state: str = STARTING
    started_s: float = field(default_factory=time.monotonic)
    drain_since_s: float | None = None
    num_restarts: int = 0
    exit_seen: bool = False
    """Its process exited and the crash was counted; the restart is still to be done."""
    failed_probes: int = 0
    """Readiness probes failed in a row while ready (`lifecycle.Limits.unhealthy_after`)."""


I = TypeVar("I", bound=Instance)  # noqa: E741


class Supervisor(Generic[I]):
    """Keeps the desired instances running and routes the ready ones (the Runtime protocol)."""

    def __init__(self, store: Store, table: RouteTable, *, max_restarts: int = 5,
                 drain_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 probe_timeout_s: float = 1.0, unhealthy_after: int = 3,
                 credential: str | None = None,
                 signal_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        """Seconds, monotonic: the lifecycle's timers (drains, stops) run on it."""
        self.credential = credential
        """The control plane's internal credential, handed to every instance it starts."""
        self.table = table
        self.max_restarts = max_restarts
        self.drain_timeout_s = drain_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.unhealthy_after = unhealthy_after
        self._probe = httpx.Client(timeout=probe_timeout_s, headers=bearer(credential))
        self._signals = SignalReader(self._probe, interval_s=signal_interval_s, clock=clock)
        self._instances: dict[str, I] = {}
        self._desired: dict[tuple[str, str], int] = {}
        self._crashes: dict[tuple[str, str], int] = {}
        self._policies: dict[tuple[str, str], dict[str, Any]] = {}
        """Per model@version, what the gateway reads from its package (`_traffic_policy`)."""
        self._backends: dict[tuple[str, str], str] = {}
        """Per model@version, its package's backend (`_backend`)."""
        # observed state not written yet because the database was away: db id -> fields
        self._unsaved: dict[int, dict[str, Any]] = {}
        self._unsaved_notes: list[tuple[str, str]] = []

    # what a runtime provides -------------------------------------------------------------

    def _create(self, model: str, version: str, db_id: int) -> I:
        """The record of a new instance (not started yet)."""
        raise NotImplementedError

    def _launch(self, instance: I, package: PackageRow) -> dict[str, Any]:
        """Start the instance's process; returns the fields to record in the store."""
        raise NotImplementedError

    def _refresh(self) -> None:
        """Called before each poll pass: fetch whatever `_exit_code` needs in one go."""

    def _exit_code(self, instance: I) -> int | None:
        """The exit status once the process is gone, None while it runs (or is starting)."""
        raise NotImplementedError

    def _terminate(self, instance: I, *, force: bool) -> None:
        """Send SIGTERM (or SIGKILL when `force`) to the instance's process."""
        raise NotImplementedError

    def _serving(self, instance: I) -> None:
        """The instance just became ready."""

    def _release(self, instance: I) -> None:
        """The process is gone: free what was kept for it (log file, actor)."""

    # the Runtime interface ---------------------------------------------------------------

    def scale(self, model: str, version: str, count: int) -> None:
        """Start or drain instances until `count` of model@version are wanted; a deployment
        whose instances fork from a zygote (even at zero: announced, or waiting for its first
        request) starts the runtime's zygotes first."""
        if (backends := self._zygote_backends()) and self._backend(model, version) in backends:
            self._want_zygotes()
        self._desired[(model, version)] = count
        live = [i for i in self._instances.values()
                if (i.model, i.version) == (model, version) and i.state in (STARTING, READY)]
        for _ in range(count - len(live)):
            self._start(model, version)
        # drain the ones not serving yet first, then the newest
        surplus = sorted(live, key=lambda i: (i.state == READY, i.started_s))[
            :max(0, len(live) - count)]
        for instance in surplus:
            self._drain(instance)

    def poll(self) -> None:
        """One pass over every instance; cheap enough to call every second. Raises
        StoreUnavailable at the end when the database was away (the pass still went on)."""
        self._refresh()
        failed: StoreUnavailable | None = None
        try:
            self._write_unsaved()
        except StoreUnavailable as exc:
            failed = exc
        for instance in list(self._instances.values()):
            try:
                self._poll_one(instance)
            except StoreUnavailable as exc:  # its restart waits; the others are still watched
                failed = failed or exc
        if failed is not None:
            raise failed

    def _poll_one(self, instance: I) -> None:
        """Observe the instance, let its lifecycle decide, carry that out."""
        life = _life(instance)
        code = None if instance.state == STOPPED else self._exit_code(instance)
        seen = lifecycle.Seen(
            exit_code=code,
            ready=lifecycle.wants_probe(life, code) and self._ready(instance),
            in_flight=self._in_flight(instance) if instance.state == DRAINING else 0)
        move = lifecycle.step(life, seen, self.clock(), self.limits)
        _live(instance, move.life)
        for effect in move.effects:
            self._carry_out(instance, effect, move.note, seen)

    def _carry_out(self, instance: I, effect: str, note: str, seen: lifecycle.Seen) -> None:
        if effect == lifecycle.FORGET:
            del self._instances[instance.id]  # the store keeps its history
            self._signals.forget(instance.id)
        elif effect in (lifecycle.TERMINATE, lifecycle.KILL):
            self._terminate(instance, force=effect == lifecycle.KILL)
        elif effect == lifecycle.COUNT_CRASH:
            key = (instance.model, instance.version)
            self._crashes[key] = self._crashes.get(key, 0) + 1
        elif effect == lifecycle.UNROUTE:
            self.table.remove_endpoint(instance.id)
        elif effect == lifecycle.RELEASE:
            self._release(instance)
        elif effect == lifecycle.NOTE:
            self._note(instance, note)
        elif effect == lifecycle.FAIL:
            self._save(instance.db_id, state=FAILED, num_restarts=instance.num_restarts)
        elif effect == lifecycle.RESTART:
            # StoreUnavailable here leaves it for the next pass: its new process is not recorded
            self._start(instance.model, instance.version, previous=instance)
        elif effect == lifecycle.SERVE:
            self._serving(instance)
        elif effect == lifecycle.SAVE:
            self._save(instance.db_id, state=instance.state, num_restarts=instance.num_restarts)
        elif effect == lifecycle.ROUTE:
            self.table.add_endpoint(instance.model, instance.version, Endpoint(
                instance.id, instance.url, grpc_target=instance.grpc_target,
                **self._traffic_policy(instance)))
        elif effect == lifecycle.MARK_HEALTH:
            with contextlib.suppress(KeyError):
                self.table.endpoint(instance.id).healthy = seen.ready

    @property
    def limits(self) -> lifecycle.Limits:
        """The lifecycle's bounds, as this runtime was configured."""
        return lifecycle.Limits(self.max_restarts, self.drain_timeout_s, self.stop_timeout_s,
                                self.unhealthy_after)

    def instances(self, model: str | None = None,
                  version: str | None = None) -> list[InstanceView]:
        """Instances that are not stopped, optionally of one model/version."""
        return [InstanceView(i.id, i.model, i.version, i.state, i.url, i.pid, i.num_restarts,
                             i.log_path)
                for i in self._instances.values()
                if (model is None or i.model == model) and (version is None or i.version == version)
                and i.state != STOPPED]

    def engine_signals(self, model: str, version: str) -> VersionSignals:
        """The engine's load signals on model@version's ready instances, from their /metrics
        (each scraped at most every `signal_interval_s`; a failed scrape is unread, not 0)."""
        return self._signals.read((i.id, i.url) for i in self._instances.values()
                                  if (i.model, i.version) == (model, version)
                                  and i.state == READY and i.url)

    def num_crashes(self, model: str, version: str) -> int:
        """Unrequested exits of model@version's instances since this runtime started."""
        return self._crashes.get((model, version), 0)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop every instance now: drain first, bounded by drain_timeout_s, then SIGTERM; the
        ones still running after `timeout_s` (default drain + stop timeouts) are killed."""
        for key in list(self._desired):
            self.scale(*key, 0)
        budget = self.drain_timeout_s + self.stop_timeout_s
        # real time: this waits for real processes (the lifecycle's timers run on `clock`)
        deadline = time.monotonic() + (budget if timeout_s is None else min(budget, timeout_s))
        while self._instances:
            with contextlib.suppress(StoreUnavailable):  # stopping needs no database
                self.poll()
            if time.monotonic() > deadline:
                for instance in self._instances.values():
                    if self._exit_code(instance) is None:
                        self._terminate(instance, force=True)
                    self._release(instance)
                    self._set_state(instance, STOPPED)
                break
            time.sleep(0.05)
        self._probe.close()

    def _backend(self, model: str, version: str) -> str | None:
        """model@version's backend, read from the store once per version (None: not
        announced, or the store is away; asked again next time)."""
        if (model, version) not in self._backends:
            try:
                self._backends[(model, version)] = self.store.get_package(model,
                                                                          version).backend
            except (NotFound, StoreUnavailable):
                return None
        return self._backends[(model, version)]

    def _zygote_backends(self) -> tuple[str, ...]:
        """The backends whose instances fork from this runtime's zygotes (none without)."""
        return ()

    def _want_zygotes(self) -> None:
        """Start this runtime's zygotes importing the engine (once; none without)."""

    def _zygotes_deployed(self) -> bool:
        """Whether an active deployment of this store forks from a zygote (then the runtime
        warms its zygotes before the first launch asks for them)."""
        if not (wanted := set(self._zygote_backends())):
            return False
        backends = {(p.name, p.version): p.backend for p in self.store.list_packages()}
        return any(d.state == "active" and backends.get((d.model, d.version)) in wanted
                   for d in self.store.list_deployments())

    # lifecycle ---------------------------------------------------------------------------

    def _start(self, model: str, version: str, previous: I | None = None) -> I:
        package = self.store.get_package(model, version)
        if previous is None:
            instance = self._create(model, version,
                                    self.store.add_instance(model, version, state=STARTING))
        else:
            instance = previous
            instance.url, instance.grpc_target, instance.pid = "", None, None
        _live(instance, lifecycle.start(_life(instance), self.clock()))
        recorded = self._launch(instance, package)
        self._instances[instance.id] = instance
        _live(instance, lifecycle.launched(_life(instance)))
        self._save(instance.db_id, state=STARTING, num_restarts=instance.num_restarts,
                   **recorded)
        return instance

    def _adopted(self, instance: I, stored_state: str) -> None:
        """Take over a live instance a previous control plane recorded (the runtime found its
        process or actor): probed again from starting, or still draining."""
        _live(instance, lifecycle.adopt(stored_state, instance.num_restarts, self.clock()))
        self._instances[instance.id] = instance
        key = (instance.model, instance.version)
        self._desired[key] = self._desired.get(key, 0) + 1
        if instance.state == DRAINING:
            self._drain(instance)

    def _drain(self, instance: I) -> None:
        _live(instance, lifecycle.drain(_life(instance), self.clock()))
        with contextlib.suppress(KeyError):
            self.table.drain(instance.id)
        self._save(instance.db_id, state=DRAINING, num_restarts=instance.num_restarts)

    def _in_flight(self, instance: I) -> int:
        try:
            return self.table.endpoint(instance.id).num_in_flight
        except KeyError:
            return 0

    def _traffic_policy(self, instance: I) -> dict[str, Any]:
        """What the gateway reads from the package: its in-flight bound, whether to resend.
        Read once per version and kept, so an instance that turns ready while the database is
        away is still routed (then with the gateway's own bound and no resend)."""
        key = (instance.model, instance.version)
        if key not in self._policies:
            try:
                manifest = self.store.get_package(instance.model, instance.version).manifest
            except NotFound:  # forgotten since it started: the gateway's bound, resend nothing
                return {"idempotent": False}
            except StoreUnavailable:
                return {"idempotent": False}  # not kept: read again once the database is back
            self._policies[key] = {"max_in_flight": declared_bound(manifest),
                                   "idempotent": bool(manifest.get("idempotent", True)),
                                   "frontends": manifest.get("frontends", "embedded")}
        return self._policies[key]

    def _ready(self, instance: I) -> bool:
        if not instance.url:
            return False
        try:
            return self._probe.get(instance.url + "/health/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def _set_state(self, instance: I, state: str) -> None:
        instance.state = state
        self._save(instance.db_id, state=state, num_restarts=instance.num_restarts)


    def _note(self, instance: I, message: str) -> None:
        behind = self._behind()
        self._unsaved_notes.append((instance.model, f"{instance.id}: {message}"))
        if not behind:
            with contextlib.suppress(StoreUnavailable):
                self._write_unsaved()

    def _save(self, db_id: int, **fields: Any) -> None:
        """Write an instance's observed state now, or at the next pass the database answers."""
        behind = self._behind()
        self._unsaved.setdefault(db_id, {}).update(fields)
        if not behind:  # else the database was just away: one retry per pass, in `poll`
            with contextlib.suppress(StoreUnavailable):
                self._write_unsaved()

    def _behind(self) -> bool:
        return bool(self._unsaved or self._unsaved_notes)

    def _write_unsaved(self) -> None:
        """Write what the database missed, oldest first; StoreUnavailable while it is away."""
        for db_id in list(self._unsaved):
            self.store.update_instance(db_id, **self._unsaved[db_id])
            del self._unsaved[db_id]
        while self._unsaved_notes:
            model, message = self._unsaved_notes[0]
            self.store.record_event("instance", message, model=model)
            self._unsaved_notes.pop(0)


def _life(instance: Instance) -> lifecycle.Life:
    return lifecycle.Life(instance.state, instance.started_s, instance.drain_since_s,
                          instance.num_restarts, instance.exit_seen, instance.failed_probes)


def _live(instance: Instance, life: lifecycle.Life) -> None:
    instance.state, instance.started_s = life.state, life.started_s
    instance.drain_since_s, instance.num_restarts = life.drain_since_s, life.num_restarts
    instance.exit_seen, instance.failed_probes = life.exit_seen, life.failed_probes
