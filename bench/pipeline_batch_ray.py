"""Batch throughput: `podium batch` in its own process vs on a two-node local Ray cluster.

    python -m bench.pipeline_batch_ray [--rows 2000] [--batch-size 64] [--concurrency 8]
                                       [--actors 2] [--node-cpus 1]

The pipeline is `bench.pipeline_overhead`'s `recommend-cached` (the `recommend` example's
control arm with a result cache: SQL member, candidates and features, xgb-example, the sort).
Each run is the `podium batch` command as a user runs it, timed whole (process start, loading
the pipeline and xgb-example, the rows, the cache writes), on an empty cache: first in one
process (the embedded default), then with `--ray-address` on a Ray cluster of two raylets on
this machine (`ray.cluster_utils`, `--node-cpus` each; `--actors` Ray Data actors, each
loading the pipeline once). Prints rows per second of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.pipeline_overhead import write_repository

PIPELINE = "recommend-cached"


def batch(root: Path, rows: Path, args: argparse.Namespace, *extra: str) -> float:
    """Seconds one `podium batch` run took on an empty cache."""
    (root / PIPELINE / "results.db").unlink(missing_ok=True)
    command = [sys.executable, "-m", "podium.cli", "batch", PIPELINE, "--input", str(rows),
               "--repository", str(root), "--batch-size", str(args.batch_size),
               "--concurrency", str(args.concurrency), *extra]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or f"{args.rows} computed" not in done.stdout:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8, help="rows at once per process")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--node-cpus", type=int, default=1)
    args = parser.parse_args()
    # every Ray process on loopback (Ray otherwise takes the machine's network address)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray.cluster_utils import Cluster

    root = write_repository(Path(tempfile.mkdtemp()))
    rows = root.parent / f"{root.name}-rows.jsonl"
    rows.write_text("".join(json.dumps({"member_id": f"m{i}"}) + "\n"
                            for i in range(args.rows)))
    local_s = batch(root, rows, args)
    node = {"node_ip_address": "127.0.0.1", "object_store_memory": 100 * 1024 * 1024,
            "num_cpus": args.node_cpus}
    cluster = Cluster(initialize_head=True, head_node_args={"include_dashboard": False, **node})
    try:
        ray._common.utils.reset_ray_address()
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray_s = batch(root, rows, args, "--ray-address", cluster.address,
                      "--ray-actors", str(args.actors))
    finally:
        cluster.shutdown()
    print(f"{'run':<34}{'rows':>6}{'seconds':>9}{'rows/s':>8}")
    print(f"{'local (one process)':<34}{args.rows:>6}{local_s:>9.1f}{args.rows / local_s:>8.0f}")
    label = f"Ray, 2 nodes x {args.node_cpus} CPU, {args.actors} actors"
    print(f"{label:<34}{args.rows:>6}{ray_s:>9.1f}{args.rows / ray_s:>8.0f}")
    print(f"  ray/local throughput x{local_s / ray_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
