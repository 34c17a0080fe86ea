"""The first vLLM instance of a fresh `podium up` (local runtime): seconds from `podium deploy`
to the instance ready, and how it started (its events: forked from the zygote, or plain).

    python -m bench.first_instance [--rounds 2] [--before SRC]

Each round starts a `podium up` with its own PODIUM_HOME (the session's model cache), announces
and deploys the default LLM, times the deploy to its first instance ready, and stops it. With
`--before SRC` (a `src/` folder of another tree, e.g. the commit before the change) each round
runs that tree's `podium up` too, in alternating order, so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import httpx

from bench.harness import median
from bench.harness.up import fresh_up, wait_for


def first_ready(src: str) -> tuple[float, list[str]]:
    """One fresh `podium up` run from `src`: seconds from deploy to the first instance ready,
    and the instances' events."""
    from podium.package.defaults import DEFAULT_MODEL, default_llm_manifest
    from podium.package.package import write_manifest

    manifest = default_llm_manifest()
    with fresh_up("bench-first-instance-", {"PYTHONPATH": src}) as up:
        package = write_manifest(up.home / "packages" / DEFAULT_MODEL, manifest).root
        api, cli, env = up.api, up.cli, up.env
        subprocess.run([*cli, "announce", str(package), "--api", api], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        started = time.monotonic()
        subprocess.run([*cli, "deploy", f"{DEFAULT_MODEL}@{manifest['version']}", "--stages",
                        "100", "--analysis-window", "0", "--warm-delay", "0", "--api", api],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        wait_for(lambda: any(i["state"] == "ready" for i in httpx.get(
            api + "/v1/status", timeout=10).json()["models"][DEFAULT_MODEL]["versions"][
                manifest["version"]]["instances"]), "the first instance ready")
        ready_s = time.monotonic() - started
        events = httpx.get(f"{api}/v1/events?model={DEFAULT_MODEL}&limit=50", timeout=10).json()
        return ready_s, [e["message"] for e in reversed(events) if e["kind"] == "instance"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", help="a src/ folder whose `podium up` is the baseline")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = {"after": here, **({"before": args.before} if args.before else {})}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            ready_s, events = first_ready(trees[name])
            times[name].append(ready_s)
            print(f"round {round_ + 1} {name:<6} ready {ready_s:5.1f}s  {events}", flush=True)
    print(json.dumps({name: {"ready_s": [round(t, 1) for t in found],
                             "median_s": round(median(found), 1)}
                      for name, found in times.items()}))


if __name__ == "__main__":
    main()
