"""Where on a Ray cluster an instance may run: its resource request, spread, and the namespace.

Pure functions over a package and the cluster's node list (no `ray` import), so every rule is
tested without a cluster:

- **Request.** The package's `resources` (docs/manifest.schema.json) as Ray actor options;
  what it leaves out comes from `podium up --ray-cpus` and, for vLLM on a cluster with GPUs,
  one GPU per tensor x pipeline parallel rank.
- **Spread.** Every instance actor is created with Ray's `SPREAD` strategy: each placement goes
  to the next node (round robin) that has the resources free, so a deployment's replicas land
  on different nodes whenever the cluster has enough of them (docs/architecture.md, "Ray
  across nodes", says why not placement groups).
- **Feasibility.** A request no live node offers in full is not an error for Ray (the actor
  waits, an autoscaler may add a node); `unplaceable` says which part is missing, so the
  control plane can write it in the instance's events while it waits.
- **Namespace.** The actors of one control plane live in a Ray namespace named after its
  database, detached from the driver, so the next control plane on that database finds them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from podium.control.models import PackageRow
from podium.package.resources import ResourceRequest

SCHEDULING_STRATEGY = "SPREAD"
"""Ray's strategy for every instance actor: replicas of a deployment on different nodes."""
MIB = 1024 * 1024


@dataclass(frozen=True)
class Resources:
    """What one instance's actor asks Ray for."""

    num_cpus: float
    num_gpus: float
    memory_bytes: int | None = None
    custom: tuple[tuple[str, float], ...] = ()
    """Custom resources, sorted by name (a tuple: the request is hashable and comparable)."""

    def actor_options(self) -> dict[str, Any]:
        """The request as `ActorClass.options(...)` keywords."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory_bytes is not None:
            options["memory"] = self.memory_bytes
        if self.custom:
            options["resources"] = dict(self.custom)
        return options

    def as_ray_names(self) -> dict[str, float]:
        """The request in the names a node lists its resources under."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus,
                  "memory": float(self.memory_bytes or 0), **dict(self.custom)}
        return {name: amount for name, amount in wanted.items() if amount > 0}


def resources_for(package: PackageRow, cluster_gpus: float, num_cpus: float = 1.0) -> Resources:
    """The package's own `resources` where it gives them; else `num_cpus` CPUs, and for a
    vLLM package on a cluster with GPUs one GPU per tensor x pipeline parallel rank of its
    `engine_args` (Ray sets the actor's CUDA_VISIBLE_DEVICES, which the server inherits).
    Without GPUs in the cluster vLLM runs on CPU."""
    manifest = package.manifest or {}
    asked = ResourceRequest.model_validate(manifest.get("resources") or {})
    gpus = asked.gpus
    if gpus is None:
        gpus = 0.0
        if package.backend == "vllm" and cluster_gpus > 0:
            args = manifest.get("engine_args", {})
            gpus = float(int(args.get("tensor_parallel_size", 1))
                         * int(args.get("pipeline_parallel_size", 1)))
    return Resources(num_cpus if asked.cpus is None else asked.cpus, gpus,
                     None if asked.memory_mib is None else asked.memory_mib * MIB,
                     tuple(sorted(asked.custom.items())))


def unplaceable(wanted: Resources, nodes: Iterable[Mapping[str, Any]]) -> str | None:
    """Why no live node can ever hold `wanted` (`ray.nodes()` entries), or None when one
    can (it may still be busy now)."""
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive")]
    asked = wanted.as_ray_names()
    if any(all(total.get(name, 0.0) >= amount for name, amount in asked.items())
           for total in alive):
        return None
    short = [f"{_field(name)}={_amount(name, amount)} (largest node: "
             f"{_amount(name, max((t.get(name, 0.0) for t in alive), default=0.0))})"
             for name, amount in asked.items()
             if all(total.get(name, 0.0) < amount for total in alive)]
    if not alive:
        return "the Ray cluster has no live node"
    if not short:
        return (f"no single node offers all of {', '.join(_field(n) for n in asked)} "
                "together")
    return "no live node offers " + ", ".join(short)


def namespace_for(database_url: str) -> str:
    """The Ray namespace of the control plane on this database (the same after a restart)."""
    return "podium-" + hashlib.sha256(database_url.encode()).hexdigest()[:16]


ACTOR_NAME_SEPARATOR = "#"


def actor_name(instance_id: str, num_restarts: int) -> str:
    """The actor of one start of an instance: a restart gets a new name, since the name of
    the actor it replaces is freed only once Ray has finished killing that one."""
    return f"{instance_id}{ACTOR_NAME_SEPARATOR}{num_restarts}"


def instance_of(name: str) -> tuple[str, int] | None:
    """(instance id, restart) of an actor name this runtime gave; None for any other name."""
    instance_id, sep, restarts = name.rpartition(ACTOR_NAME_SEPARATOR)
    if not sep or not restarts.isdigit():
        return None
    return instance_id, int(restarts)


def _field(ray_name: str) -> str:
    typed = {"CPU": "CPUs (resources.cpus, else --ray-cpus)", "GPU": "resources.gpus",
             "memory": "resources.memory_mib"}
    return typed.get(ray_name, f"resources.custom.{ray_name}")


def _amount(ray_name: str, amount: float) -> str:
    return f"{amount / MIB:g}" if ray_name == "memory" else f"{amount:g}"
