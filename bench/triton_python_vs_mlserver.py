"""A Python-backend model, Podium vs MLServer: the same scoring code as a Triton Python model
(`model.py`, TritonPythonModel) served by Podium and as an MLServer custom runtime (`MLModel`).

    python -m bench.triton_python_vs_mlserver --mlserver /tmp/mlserver-venv/bin/mlserver

The logic (one file, `pyscore_logic.py`, copied beside both): 20 FP32 features standardized,
a fixed 20x16 tanh layer, a sigmoid score. Both servers batch adaptively (Podium: Triton's
`dynamic_batching { max_queue_delay_microseconds: 500 }`, max_batch_size 64; MLServer:
max_batch_size 64, max_batch_time 0.5 ms, `parallel_workers: 0` as in
bench.kserve_vs_mlserver; `--delay-us` sets both). Load: the asyncio tritonclient, batch-1
requests, closed loop at c=1 and c=32, JSON tensors over HTTP (MLServer has no binary
extension) and gRPC. Both servers run the whole time; each cell is measured `--repeats` times
per server in A/B/B/A order. Prints each run and the Podium/MLServer ratios as median
[min .. max].
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
from podium.examples.builders import synthetic_features

LOGIC = '''
import numpy as np

_rng = np.random.default_rng(7)
MEAN = _rng.normal(size=20).astype(np.float32)
SCALE = (1.0 + _rng.random(20)).astype(np.float32)
W1 = _rng.normal(size=(20, 16)).astype(np.float32) / 4
W2 = _rng.normal(size=(16, 1)).astype(np.float32) / 4


def score(features):
    """[n, 20] float32 -> [n, 1] float32."""
    hidden = np.tanh(((features - MEAN) / SCALE) @ W1)
    return (1.0 / (1.0 + np.exp(-(hidden @ W2)))).astype(np.float32)
'''

TRITON_MODEL = '''
import triton_python_backend_utils as pb_utils
from pyscore_logic import score


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "score", score(pb_utils.get_input_tensor_by_name(r, "features").as_numpy()))])
            for r in requests]
'''

TRITON_CONFIG = '''
backend: "python"
max_batch_size: 64
input [ { name: "features" data_type: TYPE_FP32 dims: [ 20 ] } ]
output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
'''

MLSERVER_RUNTIME = '''
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from pyscore_logic import score


class PyScore(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        features = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[
            NumpyCodec.encode_output("score", score(features))])
'''


def write_repositories(root: Path, mlserver_ports: tuple[int, int], delay_us: int = 500
                       ) -> None:
    """`root/podium/pyscore` (Triton layout) and `root/mlserver/pyscore` (custom runtime),
    both batching with a queue delay of `delay_us`."""
    triton = root / "podium" / "pyscore"
    (triton / "1").mkdir(parents=True)
    (triton / "config.pbtxt").write_text(TRITON_CONFIG.replace("500", str(delay_us)))
    (triton / "1" / "model.py").write_text(TRITON_MODEL)
    (triton / "1" / "pyscore_logic.py").write_text(LOGIC)
    peer = root / "mlserver" / "pyscore"
    peer.mkdir(parents=True)
    (peer / "pyscore_logic.py").write_text(LOGIC)
    (peer / "runtime.py").write_text(MLSERVER_RUNTIME)
    (peer / "model-settings.json").write_text(json.dumps({
        "name": "pyscore", "implementation": "runtime.PyScore",
        "max_batch_size": 64, "max_batch_time": delay_us / 1e6,
        "parameters": {"version": "1"}}))
    (root / "mlserver" / "settings.json").write_text(json.dumps({
        "http_port": mlserver_ports[0], "grpc_port": mlserver_ports[1],
        "parallel_workers": 0, "metrics_port": free_port()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mlserver", default=shutil.which("mlserver"),
                        help="the mlserver executable (pip install mlserver, its own venv)")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs per server and cell, in A/B/B/A order")
    parser.add_argument("--delay-us", type=int, default=500,
                        help="both servers' batching queue delay (Triton's "
                        "max_queue_delay_microseconds, MLServer's max_batch_time)")
    args = parser.parse_args()
    if not args.mlserver:
        parser.error("MLServer not found: pip install mlserver into its own venv and pass "
                     "--mlserver PATH")
    features = synthetic_features(1024, seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ports = {name: (free_port(), free_port()) for name in ("podium", "mlserver")}
        write_repositories(root, ports["mlserver"], args.delay_us)
        results: dict[tuple[str, str, int], list[LoadResult]] = {}
        podium = kserve_server.command(root / "podium", *ports["podium"], ["pyscore"])
        mlserver = [args.mlserver, "start", str(root / "mlserver")]
        with serve(podium, kserve_server.ready_url(ports["podium"][0])), \
             serve(mlserver, kserve_server.ready_url(ports["mlserver"][0])):
            for protocol in args.protocols:
                for concurrency in args.concurrency:
                    for _repeat, server in abba(args.repeats, peer="mlserver"):
                        http_port, grpc_port = ports[server]
                        url = f"127.0.0.1:{http_port if protocol == 'http' else grpc_port}"
                        result = asyncio.run(run_load(url, protocol, "pyscore", "features",
                                                      features, concurrency=concurrency,
                                                      seconds=args.seconds, output_name="score",
                                                      binary=False))
                        results.setdefault((server, protocol, concurrency), []).append(result)
                        print(result.row(server), flush=True)
    print_load_cells(results, args.protocols, args.concurrency, "podium", "mlserver",
                     "Podium / MLServer per repeat")

if __name__ == "__main__":
    main()
