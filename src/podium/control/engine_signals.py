"""The engine's own load signals, read from the instances' `/metrics`, for the autoscaler.

vLLM 0.32 exports, per engine of an instance (labels `engine`, `model_name`):
`vllm:num_requests_waiting` (requests queued, not yet scheduled), `vllm:num_requests_running`
and `vllm:kv_cache_usage_perc` (a fraction, 1 = full, despite its name). An instance's waiting
and running requests are summed over its engines; its KV-cache usage is their mean.

Reading is cheap and bounded: an instance is scraped at most once per `interval_s`, each GET
within the client's timeout, and only when the autoscaler asks for a deployment that declares
an engine target. A failed scrape (refused, timed out, not 200, no vLLM gauges) is not a zero:
the last good reading stands for `max_age_s`, then the instance counts as unread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("podium.control")

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
_NAMES = (WAITING, RUNNING, KV_CACHE_USAGE)


class ScrapeError(Exception):
    """An instance's /metrics could not be read as engine signals."""


@dataclass(frozen=True)
class EngineReading:
    """One instance's engine signals at one scrape."""

    waiting: float
    running: float
    kv_cache_usage: float
    at_s: float
    """Monotonic time of the scrape."""


@dataclass(frozen=True)
class VersionSignals:
    """The engine signals of one deployment's serving instances."""

    num_serving: int
    num_read: int
    """Serving instances with a reading no older than max_age_s."""
    waiting: float | None = None
    """Mean waiting requests per read instance (None: none read)."""
    kv_cache_usage: float | None = None
    """Mean KV-cache usage per read instance, 0..1 (None: none read)."""

    @property
    def complete(self) -> bool:
        """Every serving instance was read."""
        return self.num_read == self.num_serving


def parse_reading(text: str, at_s: float) -> EngineReading:
    """The engine signals in one /metrics body; ScrapeError when it has no vLLM gauges."""
    # only our three gauges go through the parser: a whole vLLM exposition is ~40 families
    kept = "\n".join(line for line in text.splitlines()
                     if line.startswith(_NAMES) and not line.startswith(f"{WAITING}_by_reason"))
    values: dict[str, list[float]] = {name: [] for name in _NAMES}
    try:
        for family in text_string_to_metric_families(kept + "\n"):
            for sample in family.samples:
                if sample.name in values:
                    values[sample.name].append(float(sample.value))
    except ValueError as exc:
        raise ScrapeError(f"unparsable engine gauges ({exc})") from None
    missing = [name for name in (WAITING, KV_CACHE_USAGE) if not values[name]]
    if missing:
        raise ScrapeError(f"no {' or '.join(missing)} in /metrics (not a vLLM instance, or its "
                          "engine has not reported yet)")
    usage = values[KV_CACHE_USAGE]
    return EngineReading(waiting=sum(values[WAITING]), running=sum(values[RUNNING]),
                         kv_cache_usage=sum(usage) / len(usage), at_s=at_s)


class SignalReader:
    """Scrapes instances' /metrics at a bounded rate and keeps each one's last good reading."""

    def __init__(self, client: httpx.Client, *, interval_s: float = 2.0,
                 max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s} must be above 0")
        self.client = client
        """Carries the plane's credential and the probe timeout."""
        self.interval_s = interval_s
        self.max_age_s = 3 * interval_s if max_age_s is None else max_age_s
        self.clock = clock
        self._last: dict[str, EngineReading] = {}
        self._tried_s: dict[str, float] = {}
        self._failing: dict[str, str] = {}
        """Instance id -> why its scrapes fail (logged once per run of failures)."""

    def read(self, instances: Iterable[tuple[str, str]]) -> VersionSignals:
        """Signals of the serving instances given as (id, base URL), scraping the ones due."""
        now = self.clock()
        readings: list[EngineReading] = []
        num_serving = 0
        for instance_id, url in instances:
            num_serving += 1
            if now - self._tried_s.get(instance_id, -float("inf")) >= self.interval_s:
                self._tried_s[instance_id] = now
                self._scrape(instance_id, url, now)
            reading = self._last.get(instance_id)
            if reading is not None and now - reading.at_s <= self.max_age_s:
                readings.append(reading)
        if not readings:
            return VersionSignals(num_serving, 0)
        return VersionSignals(num_serving, len(readings),
                              waiting=sum(r.waiting for r in readings) / len(readings),
                              kv_cache_usage=sum(r.kv_cache_usage for r in readings)
                              / len(readings))

    def forget(self, instance_id: str) -> None:
        """Drop what is kept for an instance that stopped."""
        for kept in (self._last, self._tried_s, self._failing):
            kept.pop(instance_id, None)

    def _scrape(self, instance_id: str, url: str, now: float) -> None:
        try:
            response = self.client.get(url + "/metrics")
            if response.status_code != 200:
                raise ScrapeError(f"/metrics answered {response.status_code}")
            self._last[instance_id] = parse_reading(response.text, now)
        except (httpx.HTTPError, ScrapeError) as exc:
            why = f"{type(exc).__name__}: {exc}" if isinstance(exc, httpx.HTTPError) else str(exc)
            if instance_id not in self._failing:
                log.warning("engine signals of %s not read (%s); its last reading counts for "
                            "%.0f s, then it is unread (never zero)", instance_id, why,
                            self.max_age_s)
            self._failing[instance_id] = why
            return
        if self._failing.pop(instance_id, None) is not None:
            log.info("engine signals of %s read again", instance_id)
