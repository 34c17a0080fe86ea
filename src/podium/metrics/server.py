"""Podium's own `podium:*` server metrics, with fixed label sets, and helpers to record them.

Import this module only after `podium.metrics.multiproc.prepare_multiproc_dir()` in a serving
process: prometheus_client decides at import whether values go to the shared directory.

Labels are closed sets: `protocol` is one of PROTOCOLS, `endpoint` is a route template (never a
raw path), `code` is an HTTP status or a gRPC status name. Unbounded values would explode the
number of series an operator's Prometheus must hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

Protocol = Literal["openai", "kserve_http", "kserve_grpc"]
PROTOCOLS: tuple[str, ...] = ("openai", "kserve_http", "kserve_grpc")
LoadAction = Literal["load", "unload"]

REQUEST_LABELS = ("model", "version", "protocol", "endpoint", "code")
MODEL_LABELS = ("model", "version")

# Request latency of LLM calls spans milliseconds (a KServe tabular call) to minutes (a long
# generation); vLLM's own histograms cover the token-level detail.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LOAD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)

REGISTRY = CollectorRegistry(auto_describe=True)
"""Podium's metrics; exposition reads it directly only when not in multiprocess mode."""

REQUESTS = Counter(
    "podium:requests",
    "Requests answered, by model, version, protocol, endpoint and status code.",
    REQUEST_LABELS,
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "podium:request_duration_seconds",
    "Time from receiving a request to sending its last byte.",
    REQUEST_LABELS,
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
ADAPTER_TOKENS = Counter(
    "podium:adapter_tokens",
    "Tokens of LoRA adapter requests (their requests, latency and errors are podium:requests "
    "and podium:request_duration_seconds with model = the adapter), by base model, adapter, "
    "version and kind (prompt, completion).",
    ["model", "adapter", "version", "kind"],
    registry=REGISTRY,
)
ADAPTER_LOADS = Counter(
    "podium:adapter_loads",
    "LoRA adapter versions loaded into an engine on first use, by base model, adapter, "
    "version and outcome (ok; refused: the base cannot serve it; failed: the engine could "
    "not load it).",
    ["model", "adapter", "version", "outcome"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "podium:requests_in_flight",
    "Requests being served right now.",
    ("model", "version", "protocol", "endpoint"),
    multiprocess_mode="livesum",
    registry=REGISTRY,
)
QUEUE_DURATION = Histogram(
    "podium:queue_duration_seconds",
    "Time a request waited before its backend started on it (dynamic batching queue).",
    MODEL_LABELS,
    buckets=QUEUE_BUCKETS,
    registry=REGISTRY,
)
QUEUE_REFUSED = Counter(
    "podium:queue_refused",
    "Requests the dynamic batching queue refused (429), by why: queue_full (max_queue) or "
    "queue_timeout (queue_timeout_ms).",
    (*MODEL_LABELS, "reason"),
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "podium:batch_size",
    "Requests per batch formed by dynamic batching.",
    MODEL_LABELS,
    buckets=BATCH_BUCKETS,
    registry=REGISTRY,
)
EVENT_LOOP_LAG = Histogram(
    "podium:event_loop_lag_seconds",
    "How much later than due the server's event loop ran a timer (probed every 0.1 s): the "
    "share of any wait a request reports that is the loop's queue, not the thing awaited.",
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
             0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)
CONSTRAINT_COMPILE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                              0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
CONSTRAINT_COMPILE = Histogram(
    "podium:constraint_compile_seconds",
    "Time a request waited for its constraint's compiled form at admission (cache: hit or "
    "miss; compiler: process, the server's compile worker, or thread, its own threads).",
    ("type", "cache", "compiler"),
    buckets=CONSTRAINT_COMPILE_BUCKETS,
    registry=REGISTRY,
)
CONSTRAINT_COMPILE_WORK = Histogram(
    "podium:constraint_compile_work_seconds",
    "Time a constraint's compile itself took (tokenizing, trie, table, compact form), misses "
    "only: what podium:constraint_compile_seconds adds to it is the wait (compiles queued "
    "ahead, the trip to the compile worker).",
    ("type", "compiler"),
    buckets=CONSTRAINT_COMPILE_BUCKETS,
    registry=REGISTRY,
)
CONSTRAINT_TOKENIZED = Counter(
    "podium:constraint_strings_tokenized",
    "Candidate strings (choice's choices, distinct_items' items) constraint compiles had "
    "to tokenize, counted once per compile: known neither from an earlier request nor from "
    "the package's constraint_catalog.",
    ("type",),
    registry=REGISTRY,
)
MODEL_LOADS = Counter(
    "podium:model_load_events",
    "Model load and unload events, by outcome (ok or error).",
    (*MODEL_LABELS, "action", "outcome"),
    registry=REGISTRY,
)
MODEL_LOAD_DURATION = Histogram(
    "podium:model_load_duration_seconds",
    "Time to load or unload a model.",
    (*MODEL_LABELS, "action"),
    buckets=LOAD_BUCKETS,
    registry=REGISTRY,
)
MODEL_LOADED = Gauge(
    "podium:model_loaded",
    "1 while the model version is loaded and serving, else 0.",
    MODEL_LABELS,
    multiprocess_mode="mostrecent",
    registry=REGISTRY,
)
BOOT_STEP_DURATION = Gauge(
    "podium:boot_step_duration_seconds",
    "Duration of each step of the instance's boot sequence.",
    ("step",),
    multiprocess_mode="mostrecent",
    registry=REGISTRY,
)
READY = Gauge(
    "podium:ready",
    "1 once the instance has finished booting and accepts traffic, else 0.",
    multiprocess_mode="mostrecent",
    registry=REGISTRY,
)
# Set, not left at its initial value: the multiprocess collector drops a "mostrecent" gauge that
# was never set, and a booting instance must show podium:ready 0, not nothing.
READY.set(0)


def _protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r} is not one of {', '.join(PROTOCOLS)}")
    return protocol


def observe_request(
    protocol: Protocol,
    endpoint: str,
    model: str,
    version: str,
    code: int | str,
    seconds: float,
) -> None:
    """Count one answered request and its latency (`endpoint` is the route template)."""
    labels = (model, version, _protocol(protocol), endpoint, str(code))
    REQUESTS.labels(*labels).inc()
    REQUEST_DURATION.labels(*labels).observe(seconds)


@contextmanager
def track_in_flight(protocol: Protocol, endpoint: str, model: str, version: str) -> Iterator[None]:
    """Count a request as in flight for the duration of the block, even if it raises."""
    gauge = IN_FLIGHT.labels(model, version, _protocol(protocol), endpoint)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()


def observe_adapter_tokens(model: str, adapter: str, version: str, prompt: int | None,
                           completion: int | None) -> None:
    """Count the tokens of one LoRA adapter request on base `model`."""
    for kind, count in (("prompt", prompt), ("completion", completion)):
        if count:
            ADAPTER_TOKENS.labels(model, adapter, version, kind).inc(count)


def observe_adapter_load(model: str, adapter: str, version: str, outcome: str) -> None:
    """Count one first-use load of a LoRA adapter version (ok, refused or failed)."""
    ADAPTER_LOADS.labels(model, adapter, version, outcome).inc()


def observe_queue(model: str, version: str, seconds: float) -> None:
    """Record how long a request waited before its backend took it."""
    QUEUE_DURATION.labels(model, version).observe(seconds)


def observe_queue_refused(model: str, version: str, reason: str) -> None:
    """Count one request the batching queue refused (`queue_full` or `queue_timeout`)."""
    QUEUE_REFUSED.labels(model, version, reason).inc()


def observe_constraint_compile(kind: str, cached: bool, compiler: str, seconds: float) -> None:
    """Record how long a request waited for its constraint's compiled form."""
    CONSTRAINT_COMPILE.labels(kind, "hit" if cached else "miss", compiler).observe(seconds)


def observe_event_loop_lag(seconds: float) -> None:
    """Record one probe of the event loop's lag (:mod:`podium.server.loop_lag`)."""
    EVENT_LOOP_LAG.observe(seconds)


def observe_constraint_compile_work(kind: str, compiler: str, seconds: float,
                                    tokenized: int = 0) -> None:
    """Record how long one compile itself took and the candidate strings it tokenized (once
    per compile, however many requests waited for it)."""
    CONSTRAINT_COMPILE_WORK.labels(kind, compiler).observe(seconds)
    CONSTRAINT_TOKENIZED.labels(kind).inc(tokenized)


def observe_batch(model: str, version: str, size: int) -> None:
    """Record the size of one batch formed by dynamic batching."""
    if size < 1:
        raise ValueError(f"batch size={size} must be at least 1")
    BATCH_SIZE.labels(model, version).observe(size)


def observe_load(model: str, version: str, action: LoadAction, seconds: float, ok: bool) -> None:
    """Record a model load or unload, its duration and outcome; keeps podium:model_loaded true."""
    if action not in ("load", "unload"):
        raise ValueError(f"action={action!r} is not 'load' or 'unload'")
    MODEL_LOADS.labels(model, version, action, "ok" if ok else "error").inc()
    MODEL_LOAD_DURATION.labels(model, version, action).observe(seconds)
    if ok:
        MODEL_LOADED.labels(model, version).set(1 if action == "load" else 0)


def observe_boot_step(step: str, seconds: float) -> None:
    """Record how long one boot step took (unpack, resolve, plugins, metrics, engine, warmup)."""
    BOOT_STEP_DURATION.labels(step).set(seconds)


def set_ready(ready: bool) -> None:
    """Publish readiness (1 after the last boot step, 0 while draining)."""
    READY.set(1 if ready else 0)


def metric_names() -> list[str]:
    """Every sample name podium's metrics can expose (what a PromQL query selects)."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        match family.type:
            case "counter":
                names.add(f"{family.name}_total")
            case "histogram":
                names.update(f"{family.name}{s}" for s in ("_bucket", "_count", "_sum"))
            case _:
                names.add(family.name)
    return sorted(names)
