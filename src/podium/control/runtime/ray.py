"""Instances as Ray actors on a Ray cluster (`podium up --runtime ray`).

Each instance is one `InstanceHost` actor, placed by Ray on a node that offers its package's
resource request, spread across nodes (`ray_placement`), running `podium serve` on that node's
IP and free ports. The lifecycle is the `Supervisor`'s, as for local processes: readiness over
HTTP from the control plane, crash -> restart (counted), drain through the gateway before stop.
A lost node is a crash of each instance on it: restarted wherever the request fits. Starting is
asynchronous: an actor waiting for resources is an instance that is not ready yet, which a
rollout's ready timeout bounds. `ray` is imported only here, when this runtime is chosen.

The actors are named and detached, in a namespace per control plane (per database): they
outlive the control plane, and the next one on that database adopts the live ones (same actors,
same servers, probed back in) instead of starting new ones, as the local runtime adopts
processes. Actors of the namespace that match no live instance record are killed.

With zygotes on (`podium up`'s default, as for the local runtime; ``PODIUM_ZYGOTE=0`` turns them
off), each node runs a detached `ray_zygote.NodeZygote` actor in the namespace, started once
the plane has a vLLM deployment (`ray_zygote_fleet`), and the instances of vLLM packages fork
their server from their node's (`ray_zygote`), the first on a node included (it waits for the
zygote's import). Adoption leaves those actors alone (the next plane forks from them); a plane
that closes, stopping its instances, stops them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from podium.control.models import PackageRow
from podium.control.runtime.base import STOPPED, InstanceView
from podium.control.runtime.local import BOOT_NICE, SERVE_NICE
from podium.control.runtime.ray_host import InstanceHost
from podium.control.runtime.ray_placement import (
    SCHEDULING_STRATEGY,
    Resources,
    actor_name,
    instance_of,
    namespace_for,
    resources_for,
    unplaceable,
)
from podium.control.runtime.ray_zygote import WAIT_S
from podium.control.runtime.ray_zygote_fleet import ZygoteFleet
from podium.control.runtime.supervisor import Instance, Supervisor
from podium.control.store import Store
from podium.errors import Unavailable
from podium.routes.table import RouteTable

LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024
"""Object store of a head `podium up` starts itself: only small control messages go through."""
ADOPT_TIMEOUT_S = 10.0
"""How long a restarted control plane waits for its previous actors to say where they serve;
one that does not answer in time (not placed, or its node lost) is replaced."""


class ClusterUnreachable(Unavailable):
    """The Ray cluster named by --ray-address cannot be reached (fatal for `podium up`)."""


def connect(address: str | None) -> bool:
    """Join the Ray cluster at `address` (HOST:PORT of its head, or "auto"), or start a local
    head when it is None and RAY_ADDRESS is unset. False when this process was already
    connected (then whoever connected it shuts Ray down)."""
    import ray

    if ray.is_initialized():
        return False
    if address and address != "auto":
        _check_reachable(address)
    local = address is None and not os.environ.get("RAY_ADDRESS")
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 **({"object_store_memory": LOCAL_OBJECT_STORE_BYTES} if local else {}))
    except (ConnectionError, RuntimeError, SystemExit) as exc:  # Ray exits when the GCS is gone
        raise ClusterUnreachable(
            f"cannot join the Ray cluster at {address or 'RAY_ADDRESS'}: {exc}; check that "
            "`ray status` works there and that its Ray version is this one's "
            f"({ray.__version__})") from None
    return True


def _check_reachable(address: str) -> None:
    """Fail in seconds with the fix, where ray.init would retry for two minutes and exit."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnreachable(f"--ray-address {address!r} must be HOST:PORT of the Ray "
                                 "head, e.g. 10.0.0.5:6379", param="ray_address")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as exc:
        raise ClusterUnreachable(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one there "
            f"with `ray start --head --port {port}`, pass the HOST:PORT of a running head, or "
            "leave out --ray-address to start a local one", param="ray_address") from None


@dataclass
class _Actor(Instance):
    actor: Any = None
    """The InstanceHost actor handle."""
    starting: Any = None
    """The ObjectRef of its start() until it has answered."""
    exit_code: int | None = None
    node: str = ""
    """The Ray node id it was placed on ("" until placed)."""


class RayRuntime(Supervisor[_Actor]):
    """Runs instances as Ray actors; routes ready ones through a gateway route table."""

    def __init__(self, store: Store, table: RouteTable, workdir: Path, *,
                 address: str | None = None, num_cpus: float = 1.0, max_restarts: int = 5,
                 drain_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 probe_timeout_s: float = 1.0, boot_nice: int = BOOT_NICE,
                 serve_nice: int = SERVE_NICE,
                 credential: str | None = None, zygote: bool = False,
                 zygote_backends: tuple[str, ...] = ("vllm",),
                 zygote_modules: list[str] | None = None,
                 zygote_wait_s: float = WAIT_S) -> None:
        super().__init__(store, table, max_restarts=max_restarts,
                         drain_timeout_s=drain_timeout_s, stop_timeout_s=stop_timeout_s,
                         probe_timeout_s=probe_timeout_s, credential=credential)
        self.workdir = workdir
        self.num_cpus = num_cpus
        self.boot_nice, self.serve_nice = boot_nice, serve_nice
        self.namespace = namespace_for(
            store.engine.url.render_as_string(hide_password=True))
        """The Ray namespace of this control plane's actors (one per database)."""
        self._owns_ray = connect(address)
        import ray

        self._ray = ray
        self._host = ray.remote(InstanceHost)
        self.zygote, self.zygote_backends = zygote, zygote_backends
        """Instances of these backends fork from their node's zygote, waiting at most
        `zygote_wait_s` for its import (`ray_zygote`); the others, and any it cannot fork,
        start as processes."""
        # niced as a booting instance: its import must not slow the serving ones
        self._zygotes = ZygoteFleet(ray, {"namespace": self.namespace, "workdir": str(workdir),
                                          "modules": zygote_modules, "nice": boot_nice},
                                    self._zygotes_deployed)
        self._zygote_wait_s = zygote_wait_s
        self._adopt()
        if self._zygotes_deployed():  # warm before the first launch
            self._zygotes.want()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop every instance and this plane's zygotes, then leave (or shut down) Ray."""
        super().close(timeout_s)
        self._zygotes.close()
        if self._owns_ray:
            self._ray.shutdown()

    def start_zygotes(self) -> list[str]:
        """A zygote on every live node that has none yet (they import the engine in the
        background); the nodes' ids."""
        return self._zygotes.start()

    def zygotes(self) -> dict[str, Any]:
        """Node id -> what its zygote answers (`NodeZygote.target`: None while it imports)."""
        return self._zygotes.answers(self.probe_timeout_s * 5)

    def _zygote_backends(self) -> tuple[str, ...]:
        return self.zygote_backends if self.zygote else ()

    def _want_zygotes(self) -> None:
        self._zygotes.want()

    def instances(self, model: str | None = None,
                  version: str | None = None) -> list[InstanceView]:
        """As every runtime's, with the Ray node id each instance runs on."""
        views = super().instances(model, version)
        return [replace(v, node=self._instances[v.id].node) for v in views]

    def _create(self, model: str, version: str, db_id: int) -> _Actor:
        name = f"{model}-{version}-{db_id}"
        return _Actor(name, model, version, db_id,
                      log_path=str(self.workdir / "logs" / f"{name}.log"))

    def _launch(self, instance: _Actor, package: PackageRow) -> dict[str, Any]:
        wanted = resources_for(package, self._ray.cluster_resources().get("GPU", 0.0),
                               self.num_cpus)
        if (why := unplaceable(wanted, self._ray.nodes())) is not None:
            # Ray keeps it waiting (an autoscaler may add a node); the operator is told why
            self._note(instance, f"waits for a Ray node: {why}")
        zygote = None
        if package.backend in self._zygote_backends():
            self._zygotes.want()  # at the latest (before the host actor): its host waits for it
            zygote = {**self._zygotes.settings, "wait_s": self._zygote_wait_s}
        instance.actor = self._host.options(
            name=actor_name(instance.id, instance.num_restarts), namespace=self.namespace,
            lifetime="detached", scheduling_strategy=SCHEDULING_STRATEGY,
            **wanted.actor_options()).remote()
        # the credential travels as a call argument (Ray's own channel), never in the actor's
        # runtime_env, which the cluster's dashboard and state API show
        instance.starting = instance.actor.start.remote(package.location, instance.log_path,
                                                        self.boot_nice, self.credential,
                                                        zygote)
        instance.exit_code, instance.node = None, ""
        # no pid: it is another node's, and a local runtime must never adopt it
        return {"pid": None, "http_port": None, "grpc_port": None,
                "log_path": instance.log_path}

    def _refresh(self) -> None:
        """Collect finished starts, then every started server's exit status in one round;
        zygotes for nodes that joined (every few seconds)."""
        ray = self._ray
        if self.zygote:
            self._zygotes.check()
        pending = [i for i in self._instances.values() if i.starting is not None]
        if pending:
            done, _ = ray.wait([i.starting for i in pending], num_returns=len(pending),
                               timeout=0)
            for instance in pending:
                if instance.starting in done:
                    self._started(instance)
        running = [i for i in self._instances.values()
                   if i.actor is not None and i.starting is None and i.exit_code is None]
        asked = [(i, i.actor.exit_code.remote()) for i in running]
        for instance, ref in asked:
            try:
                instance.exit_code = ray.get(ref, timeout=self.probe_timeout_s)
            except ray.exceptions.GetTimeoutError:
                pass  # a busy or far node: asked again next pass
            except ray.exceptions.RayActorError as exc:
                self._lost(instance, f"its Ray actor died ({type(exc).__name__})")

    def _started(self, instance: _Actor) -> None:
        ray = self._ray
        try:
            where = ray.get(instance.starting)
        except ray.exceptions.RayError as exc:
            self._lost(instance, f"could not start on Ray: {str(exc).splitlines()[-1][:300]}")
            return
        finally:
            instance.starting = None
        self._placed(instance, where)
        self.store.update_instance(instance.db_id, http_port=where["http_port"],
                                   grpc_port=where["grpc_port"])
        started = f", {where['started']}" if where.get("started") else ""
        self._note(instance, f"placed on Ray node {where['node_id'][:12]} ({where['node']}) "
                             f"as actor {where['actor_id']}{started}")

    @staticmethod
    def _placed(instance: _Actor, where: dict[str, Any]) -> None:
        instance.url, instance.grpc_target, instance.pid = (
            where["url"], where["grpc_target"], where["pid"])
        instance.node = where["node_id"]

    def _lost(self, instance: _Actor, reason: str) -> None:
        instance.exit_code = -1
        self._note(instance, reason)

    def _exit_code(self, instance: _Actor) -> int | None:
        return instance.exit_code

    def _terminate(self, instance: _Actor, *, force: bool) -> None:
        if instance.starting is not None:  # not placed or not launched yet: nothing to drain
            self._ray.kill(instance.actor, no_restart=True)
            instance.starting, instance.exit_code = None, -int(signal.SIGKILL)
            return
        instance.actor.terminate.remote(force)

    def _serving(self, instance: _Actor) -> None:
        instance.actor.renice.remote(self.serve_nice)

    def _release(self, instance: _Actor) -> None:
        if instance.actor is None:
            return
        ray = self._ray
        # the server first (the actor's own death would only SIGTERM it), then the actor
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(instance.actor.terminate.remote(True), timeout=self.stop_timeout_s)
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(instance.actor, no_restart=True)
        instance.actor = None

    # adoption after a control-plane restart ----------------------------------------------

    def _adopt(self) -> None:
        """Take over the live actors a previous control plane left in this namespace (each
        the latest start of an instance the store still lists); stop the other records and
        kill the other actors."""
        actors = self._own_actors()
        asked = {iid: actor.where.remote() for iid, (_, actor) in actors.items()}
        done, _ = (self._ray.wait(list(asked.values()), num_returns=len(asked),
                                  timeout=ADOPT_TIMEOUT_S) if asked else ([], []))
        for model, version, row in self.store.list_instances():
            iid = f"{model}-{version}-{row.id}"
            restart, actor = actors.pop(iid, (0, None))
            answered = iid in asked and asked[iid] in done
            where = self._answer(asked[iid]) if answered else None
            if where is None or where["exit_code"] is not None:
                if actor is not None:
                    self._kill(actor)
                self.store.update_instance(row.id, state=STOPPED)
                why = ("no live Ray actor" if actor is None
                       else f"its actor did not answer within {ADOPT_TIMEOUT_S:g} s"
                       if not answered else "its actor never started a server"
                       if where is None else f"its server had exited ({where['exit_code']})")
                self.store.record_event("instance", f"{iid}: not adopted: {why}",
                                        model=model)
                continue
            instance = _Actor(iid, model, version, row.id, log_path=row.log_path, actor=actor,
                              # its next start must not reuse the name of the live actor
                              num_restarts=max(row.num_restarts, restart))
            self._placed(instance, where)
            self.store.record_event("instance", f"{iid}: adopted on Ray node "
                                    f"{instance.node[:12]} (actor {where['actor_id']})",
                                    model=model)
            self._adopted(instance, row.state)
        for _, actor in actors.values():  # no record wants them (or their instance stopped)
            self._kill(actor)

    def _own_actors(self) -> dict[str, tuple[int, Any]]:
        """instance id -> (restart, handle) of the latest actor per instance in the namespace;
        earlier ones (a restart whose predecessor was not gone yet) are killed."""
        ray = self._ray
        latest: dict[str, tuple[int, Any]] = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            named = instance_of(entry["name"])
            if entry["namespace"] != self.namespace or named is None:
                continue
            try:
                handle = ray.get_actor(entry["name"], namespace=self.namespace)
            except ValueError:  # gone since it was listed
                continue
            iid, restart = named
            if iid in latest and latest[iid][0] > restart:
                self._kill(handle)
                continue
            if iid in latest:
                self._kill(latest[iid][1])
            latest[iid] = (restart, handle)
        return latest

    def _answer(self, ref: Any) -> dict[str, Any] | None:
        try:
            return self._ray.get(ref, timeout=0)
        except self._ray.exceptions.RayError:
            return None

    def _kill(self, actor: Any) -> None:
        """Kill an actor not adopted; its server, if any, gets SIGTERM as its parent goes."""
        with contextlib.suppress(self._ray.exceptions.RayError, ValueError):
            self._ray.kill(actor, no_restart=True)


__all__ = ["ClusterUnreachable", "RayRuntime", "Resources", "connect", "resources_for"]
