"""Dynamic batching effect: xgb-example with batching on vs off, same instance, same load.

    python -m bench.kserve_batching --seconds 10 --concurrency 32

Both copies of the model (100 trees, depth 6, 20 features) load in one Podium instance; the
`-nobatch` copy's manifest sets `dynamic_batching: null`. Prints each run and on/off ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path

from bench import kserve_server
from bench.harness import free_port, serve
from bench.kserve_load import run_load
from podium.examples.builders import synthetic_features, write_xgb_example


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    args = parser.parse_args()
    features = synthetic_features(1024, seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        on = write_xgb_example(root / "xgb-example")
        off = root / "xgb-nobatch"
        shutil.copytree(on, off)
        manifest = json.loads((off / "podium.json").read_text())
        manifest.update(name="xgb-nobatch", dynamic_batching=None)
        (off / "podium.json").write_text(json.dumps(manifest))
        http_port, grpc_port = free_port(), free_port()
        with serve(kserve_server.command(root, http_port, grpc_port,
                                         ["xgb-example", "xgb-nobatch"]),
                   kserve_server.ready_url(http_port)):
            for protocol in args.protocols:
                url = f"127.0.0.1:{http_port if protocol == 'http' else grpc_port}"
                runs = {}
                for model, label in (("xgb-example", "on"), ("xgb-nobatch", "off")):
                    runs[label] = asyncio.run(run_load(url, protocol, model, "features",
                                                       features, concurrency=args.concurrency,
                                                       seconds=args.seconds))
                    print(runs[label].row(f"batch-{label}"), flush=True)
                print(f"{protocol}: batching on/off throughput "
                      f"x{runs['on'].throughput / runs['off'].throughput:.2f}, p99 "
                      f"x{runs['on'].percentile_ms(99) / runs['off'].percentile_ms(99):.2f}\n")


if __name__ == "__main__":
    main()
