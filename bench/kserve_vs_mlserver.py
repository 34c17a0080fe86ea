"""Classic model scoring, Podium vs MLServer: the same XGBoost model, client and load, one run.

    python -m bench.kserve_vs_mlserver --mlserver /tmp/mlserver-venv/bin/mlserver --seconds 10

The model is xgb-example (100 trees, depth 6, 20 FP32 features). Both servers batch
adaptively (MLServer: max_batch_size 64, max_batch_time 0.5 ms, `parallel_workers: 0`, which
MLServer 1.7.1 needs on this machine kind). Load: the asyncio tritonclient over HTTP and gRPC,
batch-1 requests, closed loop at each concurrency. MLServer's HTTP side has no binary tensor
extension, so HTTP runs send and receive JSON tensors on both servers. Both servers run the
whole time; each (protocol, concurrency) cell is measured `--repeats` times per server in
A/B/B/A order (MLServer, Podium, Podium, MLServer, ...). Prints each run and the
Podium/MLServer ratios, repeat by repeat, as median [min .. max].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path

from bench import kserve_server
from bench.harness import abba, free_port, print_load_cells, serve
from bench.kserve_load import LoadResult, run_load
from podium.examples.builders import synthetic_features, write_xgb_example


def write_mlserver_repository(xgb_dir: Path, target: Path, http_port: int, grpc_port: int
                              ) -> None:
    model_dir = target / "xgb-example"
    model_dir.mkdir(parents=True)
    shutil.copyfile(xgb_dir / "model.json", model_dir / "model.json")
    (model_dir / "model-settings.json").write_text(json.dumps({
        "name": "xgb-example", "implementation": "mlserver_xgboost.XGBoostModel",
        "max_batch_size": 64, "max_batch_time": 0.0005,
        "parameters": {"uri": "./model.json", "version": "1"}}))
    (target / "settings.json").write_text(json.dumps({
        "http_port": http_port, "grpc_port": grpc_port, "parallel_workers": 0,
        "metrics_port": free_port()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mlserver", default=shutil.which("mlserver"),
                        help="the mlserver executable (MLServer 1.7.1 + mlserver-xgboost)")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs per server and cell, in A/B/B/A order")
    args = parser.parse_args()
    if not args.mlserver:
        parser.error("MLServer not found: pip install mlserver==1.7.1 mlserver-xgboost==1.7.1 "
                     "into its own venv and pass --mlserver PATH")
    features = synthetic_features(1024, seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_xgb_example(root / "podium" / "xgb-example")
        ports = {name: (free_port(), free_port()) for name in ("podium", "mlserver")}
        write_mlserver_repository(root / "podium" / "xgb-example", root / "mlserver",
                                  *ports["mlserver"])
        results: dict[tuple[str, str, int], list[LoadResult]] = {}
        podium = kserve_server.command(root / "podium", *ports["podium"], ["xgb-example"])
        mlserver = [args.mlserver, "start", str(root / "mlserver")]
        with serve(podium, kserve_server.ready_url(ports["podium"][0])), \
             serve(mlserver, kserve_server.ready_url(ports["mlserver"][0])):
            for protocol in args.protocols:
                for concurrency in args.concurrency:
                    for _repeat, server in abba(args.repeats, peer="mlserver"):
                        http_port, grpc_port = ports[server]
                        url = f"127.0.0.1:{http_port if protocol == 'http' else grpc_port}"
                        output = "probability" if server == "podium" else "predict"
                        result = asyncio.run(run_load(url, protocol, "xgb-example", "features",
                                                      features, concurrency=concurrency,
                                                      seconds=args.seconds, output_name=output,
                                                      binary=False))
                        results.setdefault((server, protocol, concurrency), []).append(result)
                        print(result.row(server), flush=True)
    print_load_cells(results, args.protocols, args.concurrency, "podium", "mlserver",
                     "Podium / MLServer per repeat")

if __name__ == "__main__":
    main()
