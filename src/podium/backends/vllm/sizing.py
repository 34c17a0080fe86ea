"""An engine's admission bounds at boot and after: from the cached measurement or measured now.

At boot (`size_at_boot`, the boot sub-step "admission probe"):

1. the probe's last rates for this package, engine configuration, worker threads and machine
   (`probe_cache`) when there are some: the bounds are set from them at once ("measured at
   <time> on this machine"), and the engine is measured again after ready (below) when that
   measurement is older than `REFRESH_AGE_S`;
2. else the probe runs now (`probe.measure`, 1-3 s here), as before this cache, and its rates
   are cached for the next boot;
3. a probe that fails leaves the fixed defaults (logged); nothing here fails a boot.

After ready (`remeasure`, a background task): once the engine has had no request for
`IDLE_S`, the probe runs again; a request arriving meanwhile aborts it (`probe.Disturbed`: its
figures would not be the engine's own, and the request is not slowed) and it waits for the
next quiet moment, `TRIES` times at most. Its rates then replace the cached ones in force
(bounds, deadline checks) and in the cache, in one log line ("re-measured").
``PODIUM_ADMISSION_REFRESH=0`` turns the re-measurement off (the test suite does: its engines'
request counters must see only the tests' requests).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from podium import env
from podium.backends.vllm import admission, probe, probe_cache

if TYPE_CHECKING:
    from podium.backends.vllm.backend import VllmBackend

log = logging.getLogger("podium.backends.vllm")
IDLE_S = 2.0
"""Quiet the engine must have been before the re-measurement starts."""
TRIES = 3
REFRESH_AGE_S = 3600.0
"""A cached measurement younger than this is trusted as it is (no re-measurement): a rollout
or a test suite booting the same package many times in a row measures it once."""


class Sizing:
    """One engine's admission sizing: where its rates came from, and their refresh."""

    def __init__(self, backend: VllmBackend, threads: Any) -> None:
        self.backend, self.threads = backend, threads
        self.factors: dict[str, Any] | None = None
        self.task: asyncio.Task | None = None

    async def size_at_boot(self) -> None:
        backend = self.backend
        cached = self._lookup()
        if cached is not None:
            self._put_in_force(cached.rates, 0.0, cached.measured_at)
            if time.time() - cached.measured_at > REFRESH_AGE_S and env.admission_refresh():
                self.task = asyncio.ensure_future(self.remeasure())
            return
        started = time.monotonic()
        try:
            rates = await probe.measure(backend.engine, backend.task)
        except Exception:  # the warm-up served: keep serving, on the fixed defaults
            log.warning("%s: measuring the engine's speed failed; admission keeps the fixed "
                        "defaults and deadlines are not checked", backend.package.key,
                        exc_info=True)
            rates = None
        self._put_in_force(rates, time.monotonic() - started, None)
        if rates is not None:
            self._store(rates)

    async def remeasure(self) -> None:
        """The probe again once the engine is quiet (see the module's docstring)."""
        backend = self.backend
        for _ in range(TRIES):
            await probe.until_idle(backend.engine, IDLE_S)
            started = time.monotonic()
            try:
                rates = await probe.measure_undisturbed(backend.engine, backend.task)
            except probe.Disturbed as why:
                log.info("%s: re-measuring the engine's speed yielded to traffic (%s)",
                         backend.package.key, why)
                continue
            except Exception:
                log.warning("%s: re-measuring the engine's speed failed; the cached rates "
                            "stay in force", backend.package.key, exc_info=True)
                return
            self._put_in_force(rates, time.monotonic() - started, None, again=True)
            self._store(rates)
            return

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def _put_in_force(self, rates: admission.Rates | None, probe_s: float,
                      measured_at: float | None, again: bool = False) -> None:
        from podium.backends.vllm import deadline_check

        backend = self.backend
        first = backend.admission is None
        backend.admission = admission.bounds_in_force(backend.limits, backend.manifest, rates,
                                                      probe_s, measured_at)
        admission.apply(backend.engine, backend.args, backend.admission)
        if rates is not None and first:
            deadline_check.install(backend.engine, backend.admission_rates)
        line = backend.admission.describe(backend.package.key)
        log.info("%s", line.replace("admission of", "admission re-measured after ready of")
                 if again else line)

    def _lookup(self) -> probe_cache.Cached | None:
        try:
            self.factors = self._factors()
            return probe_cache.lookup(_root(), self.factors)
        except Exception:  # a cache that cannot be read is a miss, never a failed boot
            log.warning("admission probe cache: lookup failed; measuring", exc_info=True)
            self.factors = None
            return None

    def _store(self, rates: admission.Rates) -> None:
        if self.factors is not None:
            probe_cache.store(_root(), self.factors, rates)

    def _factors(self) -> dict[str, Any]:
        backend = self.backend
        weights = str(backend.args.model).rstrip("/").rsplit("/", 1)[-1]
        return probe_cache.key_factors(weights, backend.engine, self.threads,
                                       probe_cache.machine_factors())


def _root() -> Any:
    return env.cache_dir()
