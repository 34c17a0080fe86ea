"""Instances as Ray actors on a Ray cluster (`podium up --runtime ray`).

Each instance is one `InstanceHost` actor, placed by Ray where its resource request fits
(`resources_for`), running `podium serve` on its node's IP and free ports. The lifecycle is the
`Supervisor`'s, as for local processes: readiness over HTTP from the control plane, crash →
restart (counted), drain through the gateway before stop. Starting is asynchronous: an actor
waiting for resources is an instance that is not ready yet, which a rollout's ready timeout
bounds. `ray` is imported only here, when this runtime is chosen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.control.models import PackageRow
from podium.control.runtime.base import STOPPED
from podium.control.runtime.ray_host import InstanceHost
from podium.control.runtime.supervisor import Instance, Supervisor
from podium.control.store import Store
from podium.errors import Unavailable
from podium.gateway.routing import RouteTable

LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024
"""Object store of a head `podium up` starts itself: only small control messages go through."""


class ClusterUnreachable(Unavailable):
    """The Ray cluster named by --ray-address cannot be reached (fatal for `podium up`)."""


@dataclass(frozen=True)
class Resources:
    """What one instance's actor asks Ray for."""

    num_cpus: float
    num_gpus: float


def resources_for(package: PackageRow, cluster_gpus: float, num_cpus: float = 1.0) -> Resources:
    """`num_cpus` for every instance; a vLLM package on a cluster with GPUs also gets one GPU
    per tensor x pipeline parallel rank of its `engine_args` (Ray sets CUDA_VISIBLE_DEVICES of
    the actor, which the server inherits). Without GPUs in the cluster vLLM runs on CPU."""
    if package.backend != "vllm" or cluster_gpus <= 0:
        return Resources(num_cpus, 0.0)
    args = (package.manifest or {}).get("engine_args", {})
    ranks = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
    return Resources(num_cpus, float(ranks))


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


class RayRuntime(Supervisor[_Actor]):
    """Runs instances as Ray actors; routes ready ones through a gateway route table."""

    def __init__(self, store: Store, table: RouteTable, workdir: Path, *,
                 address: str | None = None, num_cpus: float = 1.0, max_restarts: int = 5,
                 drain_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 probe_timeout_s: float = 1.0, boot_nice: int = 10,
                 credential: str | None = None) -> None:
        super().__init__(store, table, max_restarts=max_restarts,
                         drain_timeout_s=drain_timeout_s, stop_timeout_s=stop_timeout_s,
                         probe_timeout_s=probe_timeout_s, credential=credential)
        self.workdir = workdir
        self.num_cpus = num_cpus
        self.boot_nice = boot_nice
        self._owns_ray = connect(address)
        import ray

        self._ray = ray
        self._host = ray.remote(InstanceHost)
        # a previous control plane's actors died with it (they are owned by their driver)
        for _, _, row in store.list_instances():
            store.update_instance(row.id, state=STOPPED)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop every instance, then leave (or shut down) Ray."""
        super().close(timeout_s)
        if self._owns_ray:
            self._ray.shutdown()

    def _create(self, model: str, version: str, db_id: int) -> _Actor:
        name = f"{model}-{version}-{db_id}"
        return _Actor(name, model, version, db_id,
                      log_path=str(self.workdir / "logs" / f"{name}.log"))

    def _launch(self, instance: _Actor, package: PackageRow) -> dict[str, Any]:
        wanted = resources_for(package, self._ray.cluster_resources().get("GPU", 0.0),
                               self.num_cpus)
        instance.actor = self._host.options(num_cpus=wanted.num_cpus,
                                            num_gpus=wanted.num_gpus).remote()
        # the credential travels as a call argument (Ray's own channel), never in the actor's
        # runtime_env, which the cluster's dashboard and state API show
        instance.starting = instance.actor.start.remote(package.location, instance.log_path,
                                                        self.boot_nice, self.credential)
        instance.exit_code = None
        # no pid: it is another node's, and a local runtime must never adopt it
        return {"pid": None, "http_port": None, "grpc_port": None,
                "log_path": instance.log_path}

    def _refresh(self) -> None:
        """Collect finished starts, then every started server's exit status in one round."""
        ray = self._ray
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
        instance.url, instance.grpc_target, instance.pid = (
            where["url"], where["grpc_target"], where["pid"])
        self.store.update_instance(instance.db_id, http_port=where["http_port"],
                                   grpc_port=where["grpc_port"])

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
        instance.actor.renice.remote(0)

    def _release(self, instance: _Actor) -> None:
        if instance.actor is None:
            return
        ray = self._ray
        # the server first (the actor's own death would only SIGTERM it), then the actor
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(instance.actor.terminate.remote(True), timeout=self.stop_timeout_s)
        ray.kill(instance.actor, no_restart=True)
        instance.actor = None
