"""Standalone vs embedded for the default LLM: boot to ready and RSS, same run, alternated.

    python -m bench.standalone_boot [--rounds 2] [--timeout-s 1800]

Each run starts `podium serve PACKAGE` on the default package (SmolLM2-135M-Instruct, already
in the model cache) with `"frontends"` set to embedded or standalone, and measures the wall
time from the process start to `/health/ready` answering 200, then the resident memory (RSS)
and CPU seconds (user + system: the work done, far less sensitive than wall time to a busy
machine) of the instance process and of its engine core (its child processes, summed), plus
the boot steps the modes differ in (from /health/ready). The order alternates (embedded, standalone,
standalone, embedded, …) so drift in the machine's load falls on both. Prints one line per run,
then the medians and standalone/embedded ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.harness import abba, free_port, median, serve

MODES = ("embedded", "standalone")
STEPS = ("mount frontends", "check engine", "start engine")
MIB = 1024 * 1024


@dataclass
class Run:
    mode: str
    ready_s: float
    instance_rss_mib: float
    engine_rss_mib: float
    instance_cpu_s: float
    engine_cpu_s: float
    steps: dict[str, float]

    @property
    def total_rss_mib(self) -> float:
        return self.instance_rss_mib + self.engine_rss_mib


def _package(root: Path, mode: str) -> Path:
    from podium.package.defaults import default_llm_manifest
    from podium.package.package import write_manifest

    return write_manifest(root / mode, {**default_llm_manifest(), "frontends": mode}).root


def measure(package: Path, mode: str, log: Path, timeout_s: float = 900) -> Run:
    """One boot of `package`: seconds to ready, RSS of the instance and its engine core."""
    http_port = free_port()
    command = [sys.executable, "-m", "podium.cli", "serve", str(package), "--host",
               "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(free_port())]
    with serve(command, f"http://127.0.0.1:{http_port}/health/ready", timeout_s=timeout_s,
               log=log, poll_s=0.1, stop_timeout_s=120) as served:
        ready = served.ready.json()
        instance = psutil.Process(served.pid)
        children = instance.children(recursive=True)
        engine_rss = sum(_rss(child) for child in children)
        instance_cpu = _cpu(instance)
        engine_cpu = sum(_cpu(child) for child in children)
        steps = {step: sum(s["seconds"] for s in ready["boot_steps"]
                           if s["step"].startswith(step)) for step in STEPS}
        return Run(mode, served.boot_s, _rss(instance) / MIB, engine_rss / MIB, instance_cpu,
                   engine_cpu, steps)


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.NoSuchProcess:
        return 0


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system


def _line(run: Run) -> str:
    steps = "  ".join(f"{name} {run.steps[name]:5.2f}s" for name in STEPS)
    return (f"{run.mode:<10}  ready {run.ready_s:6.2f}s  RSS instance "
            f"{run.instance_rss_mib:6.0f} MiB + engine core {run.engine_rss_mib:6.0f} MiB = "
            f"{run.total_rss_mib:6.0f} MiB  CPU instance {run.instance_cpu_s:6.1f}s + engine "
            f"core {run.engine_cpu_s:6.1f}s  ({steps})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode")
    parser.add_argument("--timeout-s", type=float, default=1800,
                        help="longest one boot may take (a busy 2-core machine needs minutes)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from podium.package.defaults import default_model_dir

    default_model_dir()  # in the cache before the first run: no run pays materialization
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        packages = {mode: _package(root, mode) for mode in MODES}
        for i, mode in abba(args.rounds, peer="embedded", podium="standalone"):
            run = measure(packages[mode], mode, root / f"{mode}-{i}.log", args.timeout_s)
            print(_line(run), flush=True)
            runs.append(run)
    print()
    medians = {}
    for mode in MODES:
        mine = [r for r in runs if r.mode == mode]
        medians[mode] = {key: median(getattr(r, key) for r in mine) for key in
                         ("ready_s", "instance_rss_mib", "engine_rss_mib", "total_rss_mib",
                          "instance_cpu_s", "engine_cpu_s")}
        m = medians[mode]
        print(f"median {mode:<10}  ready {m['ready_s']:6.2f}s  RSS instance "
              f"{m['instance_rss_mib']:6.0f} MiB  engine core {m['engine_rss_mib']:6.0f} MiB  "
              f"total {m['total_rss_mib']:6.0f} MiB  CPU instance {m['instance_cpu_s']:6.1f}s "
              f"engine core {m['engine_cpu_s']:6.1f}s  ({len(mine)} runs)")
    e, s = medians["embedded"], medians["standalone"]
    print(f"standalone/embedded: ready {s['ready_s'] / e['ready_s']:.2f}x "
          f"({s['ready_s'] - e['ready_s']:+.2f}s), instance RSS "
          f"{s['instance_rss_mib'] / e['instance_rss_mib']:.2f}x "
          f"({s['instance_rss_mib'] - e['instance_rss_mib']:+.0f} MiB), total RSS "
          f"{s['total_rss_mib'] / e['total_rss_mib']:.2f}x "
          f"({s['total_rss_mib'] - e['total_rss_mib']:+.0f} MiB), instance CPU "
          f"{s['instance_cpu_s'] / e['instance_cpu_s']:.2f}x "
          f"({s['instance_cpu_s'] - e['instance_cpu_s']:+.1f}s)")


if __name__ == "__main__":
    main()
