"""The boot sequence of an instance, one step per line, each logged with its duration:

    open packages (safe unpack) → mount frontends (embedded or standalone, from the packages)
    → start preloader, check engine (only when a vLLM package is served; the preloader
    imports the engine for its engine cores beside the check, `podium.preload`)
    → resolve weights from cache
    → load plugins → wipe metrics directory → start each engine (vLLM; warm-up included) or
    load each model → open the gRPC port → ready

Liveness answers from the first moment (the HTTP port opens before boot starts; inference on
it answers 503 until ready); the gRPC port stays closed until every model is loaded, so a
gRPC client never reaches an instance that cannot serve; readiness only after the last step.
The Prometheus multiprocess directory is claimed empty before any of this, first of all in
`podium.cli` (prometheus_client fixes its storage mode when first imported); the wipe step
clears what other processes wrote there since, just before the engines start writing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from podium import boot_timeline, heap
from podium.boot_timeline import SubStep
from podium.errors import BootError, PodiumError
from podium.package.adapter import adapter_of
from podium.package.cache import ModelCache
from podium.package.manifest import VllmManifest
from podium.package.package import Package
from podium.server.frontends import EMBEDDED, describe, mode_of
from podium.server.instance import BootStep, Instance
from podium.server.plugins import load_plugins
from podium.triton.package import TritonPackage

log = logging.getLogger("podium.boot")


async def boot(instance: Instance) -> None:
    """Run every boot step; on failure record why and re-raise (the instance never gets
    ready)."""
    try:
        packages = await _step(instance, "open packages", _open_packages, instance)
        adapters = [p for p in packages if adapter_of(p.manifest) is not None]
        packages = [p for p in packages if adapter_of(p.manifest) is None]
        await _step(instance, "mount frontends", _mount_frontends, instance, packages)
        if any(isinstance(p.manifest, VllmManifest) for p in packages):
            await _step(instance, "start preloader", _start_preloader)
            await _step(instance, "check engine", _check_engine,
                        instance.frontends == EMBEDDED)
        await _step(instance, "resolve weights", _resolve_weights, packages)
        if adapters:
            await _step(instance, "store adapters", _store_adapters, adapters, packages)
        await _step(instance, "load plugins", _load_plugins)
        await _step(instance, "wipe metrics directory", _wipe_metrics_directory)
        for package in _loaded_at_start(instance, packages):
            if isinstance(package, TritonPackage):
                await _step(instance, _load_step(package), _load_tolerant, instance, package)
                continue
            await _step(instance, _load_step(package), instance.repository.load, package)
        if instance.open_ports is not None:
            await _step(instance, "open gRPC port", instance.open_ports)
        instance.booted = True
        from podium.metrics.server import set_ready

        set_ready(instance.is_ready())
        heap.freeze()  # what boot left: requests' collections walk only their own objects
        log.info("ready: %d model(s) in %.1fs: %s (%s)", len(packages),
                 sum(s.seconds for s in instance.boot_steps),
                 ", ".join(p.key for p in packages), summary(instance.boot_steps))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        instance.boot_error = exc.message if isinstance(exc, PodiumError) else repr(exc)
        log.error("boot failed: %s", instance.boot_error)
        raise


async def _step(instance: Instance, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    log.info("boot step %s ...", name)
    started = time.monotonic()
    parts: list[SubStep] = []
    with boot_timeline.recording(name, parts.append):  # the step's own parts (a backend's)
        if asyncio.iscoroutinefunction(fn):
            result = await fn(*args)
        else:  # blocking work (imports, hashing) off the event loop: liveness keeps answering
            result = await asyncio.to_thread(fn, *args)
    seconds = time.monotonic() - started
    detail = result if isinstance(result, str) else ""
    instance.boot_steps.append(BootStep(name, seconds, detail, parts))
    _record_metric(name, seconds)
    for part in parts:
        _record_metric(f"{name}: {part.name}", part.seconds)
    log.info("boot step %s took %.2fs%s", name, seconds, f" ({detail})" if detail else "")
    return result


def summary(steps: list[BootStep]) -> str:
    """Every step with its duration, in order: `open packages 0.00s → … → open gRPC port`;
    a step's parts in brackets after it (`start engine m@1 6.10s [engine config 0.40s, …]`)."""
    def one(step: BootStep) -> str:
        parts = ", ".join(f"{p.name} {p.seconds:.2f}s" for p in step.steps)
        return f"{step.name} {step.seconds:.2f}s" + (f" [{parts}]" if parts else "")

    return " → ".join(one(s) for s in steps)


def _loaded_at_start(instance: Instance, packages: list[Package]) -> list[Package]:
    """The packages the model control mode loads now (explicit: the --load-model names; the
    others stay in the index, loadable over the API)."""
    control = instance.repository.control
    names = {p.manifest.name for p in packages} | {r["name"] for r in instance.repository.index()}
    missing = [n for n in control.load_models if n != "*" and n not in names]
    if missing:
        raise BootError(f"--load-model {' '.join(missing)}: no such model in the repository "
                        f"(models: {', '.join(sorted(names)) or 'none'})")
    return [p for p in packages if control.loads_at_start(p.manifest.name)]


def _load_step(package: Package) -> str:
    # a vLLM package's load is its engine's start (engine core process, warm-up request)
    verb = "start engine" if isinstance(package.manifest, VllmManifest) else "load"
    return f"{verb} {package.key}"


def _open_packages(instance: Instance) -> list[Package]:
    from podium.repository import scan_repository
    from podium.repository.scan import open_served

    config = instance.config
    packages = [p for location in config.packages for p in open_served(location)]
    if config.repository is not None:
        failures: dict[tuple[str, str], str] = {}
        packages += scan_repository(config.repository, failures)
        instance.repository.note_failures(failures)
        for (name, _), reason in failures.items():
            log.error("model %s is not served: %s", name, reason)
    if not packages and not (config.repository and instance.repository.index()):
        raise BootError("nothing to serve: give a package, --repository DIR, or no argument "
                        "for the default model")
    seen: set[str] = set()
    for package in packages:
        if package.key in seen:
            raise BootError(f"{package.key} is given twice")
        seen.add(package.key)
        instance.repository.packages[package.key] = package
    return packages


async def _load_tolerant(instance: Instance, package: Package) -> str:
    """A Triton repository as Triton serves it: a model that fails to load is reported (the
    repository index keeps the reason) and the others serve."""
    try:
        await instance.repository.load(package)
    except PodiumError as exc:
        log.error("model %s is not served: %s", package.key, exc.message)
        return f"failed: {exc.message}"
    return ""


async def _mount_frontends(instance: Instance, packages: list[Package]) -> str:
    mode = mode_of(p.manifest.frontends for p in packages)
    if instance.mount_frontends is not None:  # None: an app-less boot (tests)
        await instance.mount_frontends(mode)
    instance.frontends = mode
    return describe(mode)


def _start_preloader() -> str:
    from podium.preload import start

    return start()


def _check_engine(openai: bool) -> str:
    from podium.engine import check_engine

    return check_engine(openai=openai)


async def _resolve_weights(packages: list[Package]) -> None:
    """Boot reads weights only from the cache; a package never announced is materialized
    here, with a log line saying so."""
    cache = ModelCache()
    for package in packages:
        if not isinstance(package.manifest, VllmManifest):
            continue
        if cache.lookup(package) is None:
            log.warning("%s is not in the model cache: materializing it now (announce it with "
                        "`podium materialize` to keep this off the boot path)", package.key)
            await asyncio.to_thread(cache.materialize, package)


def _store_adapters(adapters: list[Package], packages: list[Package]) -> str:
    """The repository's LoRA adapters checked against their base (served here) and put in the
    cache, where the base's instance finds them; a bad one is refused with its reason and
    the rest still serve."""
    from podium.package.adapter_base import info_of, store_adapter

    bases = {p.key: p for p in packages}
    stored = []
    for adapter in adapters:
        info = info_of(adapter)
        base = bases.get(info.base_key)
        if base is None:
            log.error("adapter %s is not served: its base %s is not served here", info.key,
                      info.base_key)
            continue
        try:
            store_adapter(adapter, base)
        except PodiumError as exc:
            log.error("adapter %s is not served: %s", info.key, exc.message)
            continue
        stored.append(info.key)
    return ", ".join(stored) or "none"


def _load_plugins() -> str:
    return ", ".join(load_plugins()) or "none"


def _wipe_metrics_directory() -> str:
    from podium.metrics.multiproc import wipe_foreign

    removed = wipe_foreign()
    return "no multiprocess directory" if removed is None else f"{removed} stale file(s)"


def _record_metric(step: str, seconds: float) -> None:
    from podium.metrics.server import observe_boot_step

    observe_boot_step(step, seconds)
