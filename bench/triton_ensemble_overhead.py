"""Triton ensemble overhead: one call to an ensemble (a Python preprocessing step, then an ONNX
model, run in-process) vs the client calling the two steps one after the other.

    python -m bench.triton_ensemble_overhead

One Podium KServe server (bench.kserve_server) serves a Triton repository: `scale` (Python
backend, x * 2), `onnx_add` (ONNX Runtime, x + 10) and `pipeline` (`platform: "ensemble"`,
scale → onnx_add). Both steps batch dynamically (max_batch_size 8, 500 µs). Load: the asyncio
tritonclient, batch-1 requests of 3 FP32, closed loop at c=1 and c=32, binary tensors over HTTP
and gRPC. Each cell runs `--repeats` times per side in A/B/B/A order (steps, ensemble, ...).
Prints each run and the ensemble/steps ratios as median [min .. max]: a throughput ratio above
1 and latency ratios below 1 mean the ensemble saves what the client's second round trip costs.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import kserve_server
from bench.harness import abba, closed_loop, free_port, print_load_cells, serve
from bench.kserve_load import LoadResult

SCALE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "SCALED", pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy() * 2)])
            for r in requests]
'''
BATCHING = '''max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 500 }
'''
CONFIGS = {
    "scale": 'backend: "python"\n' + BATCHING +
             'input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
             'output [ { name: "SCALED" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
    "onnx_add": 'platform: "onnxruntime_onnx"\n' + BATCHING +
                'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
                'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
    "pipeline": '''platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1
    input_map { key: "RAW" value: "RAW" } output_map { key: "SCALED" value: "scaled" } },
  { model_name: "onnx_add" model_version: -1
    input_map { key: "x" value: "scaled" } output_map { key: "y" value: "RESULT" } } ] }
''',
}


def write_repository(root: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    for name, config in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    (root / "scale" / "1" / "model.py").write_text(SCALE)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor("c", TensorProto.FLOAT, [3], [10.0] * 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(root / "onnx_add" / "1" / "model.onnx"))


async def run(url: str, protocol: str, side: str, *, concurrency: int, seconds: float
              ) -> LoadResult:
    if protocol == "http":
        import tritonclient.http.aio as module

        client = module.InferenceServerClient(url, conn_limit=concurrency)
    else:
        import tritonclient.grpc.aio as module

        client = module.InferenceServerClient(url)
    row = np.array([[1, 2, 3]], dtype=np.float32)

    def tensor(name: str, value: np.ndarray):  # type: ignore[no-untyped-def]
        made = module.InferInput(name, list(value.shape), "FP32")
        made.set_data_from_numpy(value)
        return made

    async def ensemble() -> object:
        return (await client.infer("pipeline", [tensor("RAW", row)])).as_numpy("RESULT")

    async def steps() -> object:
        scaled = (await client.infer("scale", [tensor("RAW", row)])).as_numpy("SCALED")
        return (await client.infer("onnx_add", [tensor("x", scaled)])).as_numpy("y")

    call = ensemble if side == "ensemble" else steps
    try:
        np.testing.assert_allclose(await call(), row * 2 + 10)
        await closed_loop(call, concurrency, seconds=1.0)
        started = time.perf_counter()
        samples = await closed_loop(call, concurrency, seconds=seconds)
        elapsed = time.perf_counter() - started
    finally:
        await client.close()
    return LoadResult(protocol, concurrency, len(samples), elapsed,
                      [sample.seconds for sample in samples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs per side and cell, in A/B/B/A order")
    args = parser.parse_args()
    results: dict[tuple[str, str, int], list[LoadResult]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_repository(root)
        http_port, grpc_port = free_port(), free_port()
        command = kserve_server.command(root, http_port, grpc_port, list(CONFIGS))
        with serve(command, kserve_server.ready_url(http_port)):
            for protocol in args.protocols:
                url = f"127.0.0.1:{http_port if protocol == 'http' else grpc_port}"
                for concurrency in args.concurrency:
                    for _repeat, side in abba(args.repeats, peer="steps", podium="ensemble"):
                        result = asyncio.run(run(url, protocol, side, concurrency=concurrency,
                                                 seconds=args.seconds))
                        results.setdefault((side, protocol, concurrency), []).append(result)
                        print(result.row(side), flush=True)
    print_load_cells(results, args.protocols, args.concurrency, "ensemble", "steps",
                     "Ensemble / steps one by one, per repeat")

if __name__ == "__main__":
    main()
