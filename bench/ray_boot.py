"""Boot to ready of the default LLM as an instance of the Ray runtime, by start path.

    python -m bench.ray_boot [--modes zygote,plain] [--repeats 3]
    python -m bench.ray_boot --modes first,plain,first-nowait --repeats 2

Each run starts a local Ray head (this machine's CPUs, no dashboard), a `RayRuntime` on a fresh
SQLite store with the default package (SmolLM2-135M-Instruct, already in the model cache), and
scales it to one instance with one start path:

- `zygote`: the instance's server forked from its node's zygote (`control.runtime.ray_zygote`);
  the zygote is started and its import waited for before the clock starts (a warm node);
- `first`: the first instance on a fresh head: the runtime starts the node's zygote as it
  starts (the store has the deployment) and is scaled at once; the instance's host waits for
  the zygote's import, then forks (`ray_zygote.WAIT_S`);
- `first-nowait`: as `first` with no wait (``zygote_wait_s=0``, as before the wait existed):
  the instance starts plain beside the importing zygote;
- `plain`: zygotes off (``PODIUM_ZYGOTE=0``): `podium serve` a subprocess of the host actor;
- `zygote-omp1`, `plain-omp1`: as those, with ``OMP_NUM_THREADS=1`` in the node's environment
  before Ray starts: the value Ray sets in every actor, kept (an operator's value is), as the
  instance had it before `ray_zygote.without_ray_threads` dropped Ray's.

It measures the wall time from `scale` to the runtime's READY (its readiness probe answered)
and reads the "start engine" boot step and how the engine's worker started from the instance's
log. One Ray head per run; the modes alternate (A B B A ...) so drift in the machine's load
falls on each. Prints one line per run, then each mode's median [min..max] and its ratio to the
first mode's, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

from bench.harness.report import Spread

MODES = ("zygote", "plain", "first", "first-nowait", "zygote-omp1", "plain-omp1")
ENGINE_STEP = re.compile(r"boot step start engine \S+ took ([0-9.]+)s")
WAITED = re.compile(r"after waiting ([0-9.]+) s for its import")


def run(mode: str, timeout_s: float) -> dict:
    import ray

    from podium.control.runtime.base import READY
    from podium.control.runtime.ray import RayRuntime
    from podium.control.store import Store
    from podium.package.defaults import DEFAULT_MODEL, default_llm_manifest
    from podium.package.package import write_manifest
    from podium.routes.table import RouteTable

    saved = os.environ.get("OMP_NUM_THREADS")
    if mode.endswith("-omp1"):
        os.environ["OMP_NUM_THREADS"] = "1"
    else:
        os.environ.pop("OMP_NUM_THREADS", None)
    tmp = Path(tempfile.mkdtemp(prefix="podium-ray-boot-"))
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024 * 1024)
    store = Store.open(f"sqlite:///{tmp / 'control.db'}")
    runtime = None
    try:
        manifest = default_llm_manifest()
        folder = write_manifest(tmp / "package", manifest).root
        store.announce_package(DEFAULT_MODEL, manifest["version"], "vllm", str(folder), manifest)
        store.ensure_deployment(DEFAULT_MODEL, manifest["version"], "red-black")
        runtime = RayRuntime(store, RouteTable(), tmp / "instances", num_cpus=1.0,
                             zygote=not mode.startswith("plain"),
                             **({"zygote_wait_s": 0.0} if mode == "first-nowait" else {}))
        zygote_s = 0.0
        if mode.startswith("zygote"):
            began = time.monotonic()
            nodes = runtime.start_zygotes()
            while not all(runtime.zygotes().get(n) for n in nodes):
                assert time.monotonic() - began < timeout_s, "zygote never ready"
                time.sleep(0.2)
            zygote_s = time.monotonic() - began
        started = time.monotonic()
        runtime.scale(DEFAULT_MODEL, manifest["version"], 1)
        while [i.state for i in runtime.instances()] != [READY]:
            assert time.monotonic() - started < timeout_s, runtime.instances()
            runtime.poll()
            time.sleep(0.05)
        ready_s = time.monotonic() - started
        [instance] = runtime.instances()
        log = Path(instance.log_path or "").read_text()
        events = [e.message for e in store.list_events(DEFAULT_MODEL)]
        engine = ENGINE_STEP.search(log)
        waited = [float(m.group(1)) for e in events if (m := WAITED.search(e))]
        return {"mode": mode, "ready_s": round(ready_s, 2), "zygote_import_s": round(zygote_s, 1),
                "start_engine_s": float(engine.group(1)) if engine else None,
                "forked": any("forked from the node's zygote" in e for e in events),
                "waited_s": waited[0] if waited else None,
                "worker": ("forked" if "engine worker forked" in log else "spawned")}
    finally:
        if runtime is not None:
            runtime.close()
        store.close()
        ray.shutdown()
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="zygote,plain",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode")
    parser.add_argument("--timeout-s", type=float, default=300)
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: {', '.join(unknown)} not among {', '.join(MODES)}")
    order = [m for r in range(args.repeats) for m in (modes if r % 2 == 0 else modes[::-1])]
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for mode in order:
        found = run(mode, args.timeout_s)
        results[mode].append(found)
        print(json.dumps(found), flush=True)
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")
    first = results[modes[0]]
    for mode in modes:
        ready = Spread(tuple(r["ready_s"] for r in results[mode]))
        engine = tuple(r["start_engine_s"] for r in results[mode]
                       if r["start_engine_s"] is not None)
        ratio = Spread(tuple(r["ready_s"] / f["ready_s"] for r, f in zip(results[mode], first,
                                                                         strict=False)))
        waited = tuple(r["waited_s"] for r in results[mode] if r["waited_s"] is not None)
        forked = sum(r["forked"] for r in results[mode])
        print(f"{mode}: ready {ready} s, start engine "
              f"{Spread(engine) if engine else '-'} s, x{ratio} of {modes[0]}, forked "
              f"{forked}/{len(results[mode])}, waited {Spread(waited) if waited else '-'} s")


if __name__ == "__main__":
    main()
