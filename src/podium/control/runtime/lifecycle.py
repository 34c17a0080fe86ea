"""An instance's lifecycle: a pure state machine on an injected clock.

    starting --ready probe answers--> ready --scaled away--> draining --process gone--> stopped

- start: a new or restarted process is starting; it turns ready when its probe answers 200.
- drain: scaled away, it takes no new request; once none is in flight (or `drain_timeout_s`
  ran out) it is sent SIGTERM, and SIGKILL past drain + stop timeouts; stopped once gone.
- crash: an exit nobody asked for is counted once, then restarted (starting again), up to
  `max_restarts`; then it is left failed.
- adopt: a live instance a previous control plane recorded starts over from starting (a ready
  one answers its probe at the next pass), or keeps draining.

`step(life, seen, now_s, limits)` takes what the supervisor observed of one instance in this
pass (`Seen`: its exit status, its readiness probe, its requests in flight) and returns the next
`Life` and the effects to carry out, in order (`Transition`); `start`/`launched`, `drain` and
`adopt` are the transitions the supervisor asks for itself. No I/O and no clock of its own: the
supervisor (`runtime/supervisor.py`) probes, writes the store, edits routes and signals
processes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from podium.control.runtime.base import DRAINING, READY, STARTING, STOPPED

FORGET, TERMINATE, KILL = "forget", "terminate", "kill"
"""Effects: drop a stopped instance from memory; SIGTERM its process; SIGKILL it."""
COUNT_CRASH, UNROUTE, RELEASE, NOTE = "count_crash", "unroute", "release", "note"
"""Effects: count one crash of its version; take it off the route table; free what its process
held (log file, actor); record the transition's note as an event."""
RESTART, FAIL = "restart", "fail"
"""Effects: start its process again; write FAILED to the store (in memory it is stopped)."""
SERVE, ROUTE, MARK_HEALTH, SAVE = "serve", "route", "mark_health", "save"
"""Effects: it became ready (runtime hook); route to it; set its route's health from the probe;
write its new state to the store."""


@dataclass(frozen=True)
class Limits:
    """How long an instance may take to drain and stop, and how often it may crash."""

    max_restarts: int = 5
    """Restarts after crashes before the instance is left failed."""
    drain_timeout_s: float = 30.0
    """Longest wait for in-flight requests before SIGTERM."""
    stop_timeout_s: float = 10.0
    """Longest wait after SIGTERM before SIGKILL."""
    unhealthy_after: int = 3
    """Readiness probes in a row a ready instance must fail before it leaves routing: one
    probe that timed out on a loaded host is not a hung instance, and taking a version's only
    instance off on it answers every request 503 until the next pass (as Kubernetes'
    `failureThreshold: 3`). A refused connection on the request path takes it off at once."""


@dataclass(frozen=True)
class Life:
    """Where one instance is in its lifecycle."""

    state: str = STARTING
    started_s: float = 0.0
    drain_since_s: float | None = None
    num_restarts: int = 0
    exit_seen: bool = False
    """Its process exited and the crash was counted; the restart is still to be done."""
    failed_probes: int = 0
    """Readiness probes failed in a row since it was ready (or last answered)."""


@dataclass(frozen=True)
class Seen:
    """What the supervisor observed of one instance in this pass."""

    exit_code: int | None = None
    """Its process's exit status; None while it runs."""
    ready: bool = False
    """Its readiness probe answered 200 (probed only where `wants_probe` says)."""
    in_flight: int = 0
    """Requests in flight on it (read only while it drains)."""


@dataclass(frozen=True)
class Transition:
    """The next life of an instance and the effects to carry out, in order."""

    life: Life
    effects: tuple[str, ...] = ()
    note: str = ""
    """An event to record about the instance (e.g. `exited with status 1`)."""


def wants_probe(life: Life, exit_code: int | None) -> bool:
    """Whether `step` needs this pass's readiness probe of the instance."""
    return exit_code is None and life.state in (STARTING, READY)


def start(life: Life, now_s: float) -> Life:
    """Its process is being (re)started: starting again (its exit stays pending until
    `launched`, so a launch that fails does not count the crash twice)."""
    return replace(life, state=STARTING, started_s=now_s)


def launched(life: Life) -> Life:
    """Its new process runs: the exit that led to it is dealt with."""
    return replace(life, exit_seen=False)


def drain(life: Life, now_s: float) -> Life:
    """Scaled away: no new request goes to it; it stops once the ones in flight finish."""
    return replace(life, state=DRAINING, drain_since_s=now_s)


def adopt(stored_state: str, num_restarts: int, now_s: float) -> Life:
    """A live instance a previous control plane recorded, as this one takes it over: probed
    again from starting (a ready one answers at the next pass), or still draining."""
    life = Life(state=STARTING, started_s=now_s, num_restarts=num_restarts)
    return drain(life, now_s) if stored_state == DRAINING else life


def step(life: Life, seen: Seen, now_s: float, limits: Limits) -> Transition:
    """One pass over one instance."""
    if life.state == STOPPED:
        return Transition(life, (FORGET,))
    if life.state == DRAINING:
        return _draining(life, seen, now_s, limits)
    if seen.exit_code is not None:
        return _crashed(life, seen.exit_code, limits)
    if life.state == STARTING and seen.ready:
        return Transition(replace(life, state=READY), (SERVE, SAVE, ROUTE))
    if life.state == READY:
        return _probed(life, seen, limits)
    return Transition(life)


def _probed(life: Life, seen: Seen, limits: Limits) -> Transition:
    """A ready instance's route follows its probe: back at once when it answers, off only
    after `unhealthy_after` failures in a row (a hung instance leaves routing, not the plane)."""
    if seen.ready:
        return Transition(replace(life, failed_probes=0), (MARK_HEALTH,))
    failed = life.failed_probes + 1
    effects = (MARK_HEALTH,) if failed >= limits.unhealthy_after else ()
    return Transition(replace(life, failed_probes=failed), effects)


def _draining(life: Life, seen: Seen, now_s: float, limits: Limits) -> Transition:
    if seen.exit_code is not None:
        return Transition(replace(life, state=STOPPED), (UNROUTE, RELEASE, SAVE))
    waited = now_s - (life.drain_since_s or 0)
    if seen.in_flight > 0 and waited < limits.drain_timeout_s:
        return Transition(life)
    # SIGTERM (the server finishes its own in-flight work), SIGKILL if it lingers
    force = waited > limits.drain_timeout_s + limits.stop_timeout_s
    return Transition(life, (KILL if force else TERMINATE,))


def _crashed(life: Life, code: int, limits: Limits) -> Transition:
    if life.exit_seen:  # counted once, however many passes its restart takes
        return Transition(life, (RESTART,))
    seen = replace(life, exit_seen=True)
    effects = (COUNT_CRASH, UNROUTE, RELEASE, NOTE)
    note = f"exited with status {code}"
    if life.num_restarts >= limits.max_restarts:
        # FAILED is what the store keeps; in memory it no longer counts as live
        return Transition(replace(seen, state=STOPPED), (*effects, FAIL), note)
    return Transition(replace(seen, num_restarts=life.num_restarts + 1), (*effects, RESTART),
                      note)
