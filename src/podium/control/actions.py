"""What the rollout controller asks the world to do: desired state, never procedures.

Every action is idempotent (scale *to* n, set the split *to* w), so a control plane that dies
between writing a step and carrying it out simply carries it out again after a restart. Each
names the region it acts in (`default` where only one is declared). A policy's step is one
`Decision`: the state to write, the actions to carry out, and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

DEFAULT_REGION = "default"
"""The one region of a control plane that declares none."""


@dataclass(frozen=True)
class Scale:
    """Keep exactly `count` instances of model@version (0 drains and stops them all)."""

    model: str
    version: str
    count: int
    region: str = DEFAULT_REGION
    kind: str = field(default="scale", init=False)


@dataclass(frozen=True)
class SetSplit:
    """Route the model's unversioned traffic by these weights (percent, summing to 100)."""

    model: str
    weights: dict[str, int]
    region: str = DEFAULT_REGION
    kind: str = field(default="split", init=False)


@dataclass(frozen=True)
class MoveAlias:
    """Point `alias` (e.g. `latest`) of the model at `version`."""

    model: str
    alias: str
    version: str
    region: str = DEFAULT_REGION
    kind: str = field(default="alias", init=False)


Action = Scale | SetSplit | MoveAlias
S = TypeVar("S")


@dataclass(frozen=True)
class Decision(Generic[S]):
    """One step of a policy: the state to write, then the actions to carry out, and why."""

    state: S
    actions: list[Action]
    note: str


def action_to_dict(action: Action) -> dict[str, Any]:
    """JSON-ready form of an action, as stored in `rollout_steps.actions` (the region only
    where it is not `default`: a single-region plane's steps read as they always did)."""
    data = asdict(action)
    if data["region"] == DEFAULT_REGION:
        del data["region"]
    return data

