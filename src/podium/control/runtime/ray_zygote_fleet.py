"""The Ray runtime's side of the node zygotes (`ray_zygote`): which nodes have one, starting
them early enough for the first instance on a node to fork, and stopping them with the plane.

- **When**: once this plane has a deployment of a zygote backend (vLLM): found in the store
  when the runtime starts (a plane that restarts with its deployments), or when one is scaled,
  to zero included (announced, or left at zero until its first request), and at the latest at
  its first launch (`want`). Then a zygote starts on every live node at once, and on each node
  that joins later, seen within `CHECK_S` (`check`). A plane with no such deployment starts
  none: a zygote imports the engine and holds its memory.
- A launch that still finds its node's zygote importing waits for it (`ray_zygote.WAIT_S`), so
  these only make that wait shorter or nothing.
- **Stop**: each zygote actor is asked to stop its zygote and remove its folder, then killed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from podium.control.runtime.ray_zygote import NAME_PREFIX, node_zygote

log = logging.getLogger("podium.control")
CHECK_S = 5.0
"""How often `check` looks for a deployment that wants zygotes, then for nodes that joined."""
STOP_TIMEOUT_S = 10.0
"""How long closing waits for the zygote actors to stop their zygotes before killing them."""


class ZygoteFleet:
    """The zygote actors of one control plane's namespace, one per live node."""

    def __init__(self, ray: Any, settings: dict[str, Any],
                 wanted_by_store: Callable[[], bool]) -> None:
        self._ray, self.settings = ray, settings
        """`ray_zygote.node_zygote`'s settings (namespace, workdir, modules, nice)."""
        self._wanted_by_store = wanted_by_store
        """Whether the store has a deployment whose instances fork from a zygote."""
        self.wanted = False
        """A zygote on every node (set once; a plane that stops wanting them closes)."""
        self.nodes: set[str] = set()
        """Nodes a zygote actor was made (or found) on."""
        self._checked = time.monotonic()

    def want(self) -> None:
        """Zygotes from now on: one on every live node now (made where missing)."""
        if self.wanted:
            return
        self.wanted = True
        with contextlib.suppress(self._ray.exceptions.RayError):
            self.start()

    def start(self) -> list[str]:
        """A zygote on every live node (got or made by name; they import in the background);
        the nodes' ids."""
        nodes = [n["NodeID"] for n in self._ray.nodes() if n.get("Alive")]
        for node in nodes:
            if node not in self.nodes:
                log.info("node %s: its zygote starts (it imports the engine for the instances "
                         "to come)", node[:12])
            node_zygote(self._ray, node, **self.settings)
        self.nodes.update(nodes)
        return nodes

    def check(self) -> None:
        """Every `CHECK_S`: want zygotes once the store has a deployment that needs them;
        then start one on each node that joined. Errors wait for the next check."""
        now = time.monotonic()
        if now - self._checked < CHECK_S:
            return
        self._checked = now
        with contextlib.suppress(Exception):
            if not self.wanted:
                if self._wanted_by_store():
                    self.want()
                return
            live = {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")}
            if live - self.nodes:
                self.start()

    def answers(self, timeout_s: float) -> dict[str, Any]:
        """Node id -> what its zygote answers (`NodeZygote.target`: None while it imports)."""
        ray = self._ray
        found = {}
        for node in self.nodes:
            with contextlib.suppress(ValueError, ray.exceptions.RayError):
                actor = ray.get_actor(NAME_PREFIX + node, namespace=self.settings["namespace"])
                found[node] = ray.get(actor.target.remote(), timeout=timeout_s)
        return found

    def close(self) -> None:
        """Stop every zygote of the namespace (their folders removed), then kill their actors
        (one that did not stop in time too)."""
        ray = self._ray
        actors = []
        with contextlib.suppress(ray.exceptions.RayError):
            for entry in ray.util.list_named_actors(all_namespaces=True):
                if (entry["namespace"] == self.settings["namespace"]
                        and entry["name"].startswith(NAME_PREFIX)):
                    with contextlib.suppress(ValueError, ray.exceptions.RayError):
                        actors.append(ray.get_actor(entry["name"],
                                                    namespace=self.settings["namespace"]))
        stopping = []
        for actor in actors:
            with contextlib.suppress(AttributeError, ray.exceptions.RayError):  # an old one
                stopping.append(actor.stop.remote())
        if stopping:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.wait(stopping, num_returns=len(stopping), timeout=STOP_TIMEOUT_S)
        for actor in actors:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(actor, no_restart=True)
        self.nodes.clear()
