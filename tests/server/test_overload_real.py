"""A real `podium serve` under overload: a slow python model with a tiny queue answers the
excess with fast 429s (Retry-After, KServe body) and RESOURCE_EXHAUSTED on gRPC, never a 5xx,
and serves a good request once the spike is over."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
from tritonclient.grpc import service_pb2, service_pb2_grpc

from podium.package.package import write_manifest
from tests.support.harness import running_instance

ROW = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}]}
MODEL_S = 1.0
"""How long one model call takes."""


def _slow_package(root: Path) -> Path:
    root.mkdir()
    (root / "model.py").write_text(
        "import time\n"
        "class Model:\n"
        "    def execute(self, requests):\n"
        f"        time.sleep({MODEL_S})\n"
        "        return [{'y': r['x'] * 2} for r in requests]\n")
    write_manifest(root, {
        "name": "slow", "backend": "python", "max_batch_size": 1,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}],
        "dynamic_batching": {"max_queue": 64}})  # the flag below overrides it
    return root


async def _spike(url: str, count: int) -> list[tuple[int, float, httpx.Response]]:
    async with httpx.AsyncClient(timeout=60) as client:
        async def one() -> tuple[int, float, httpx.Response]:
            started = time.monotonic()
            r = await client.post(f"{url}/v2/models/slow/infer", json=ROW)
            return r.status_code, time.monotonic() - started, r

        return await asyncio.gather(*(one() for _ in range(count)))


def test_a_spike_gets_fast_429s_never_a_5xx_then_service(tmp_path: Path) -> None:
    package = _slow_package(tmp_path / "slow")
    with running_instance([str(package), "--max-queue", "2"], tmp_path / "serve.log") as served:
        answers = asyncio.run(_spike(served.http_url, 16))
        statuses = [status for status, _, _ in answers]
        assert not [s for s in statuses if s >= 500], statuses
        assert set(statuses) == {200, 429}, statuses
        # at most two wait (the first ones may wait together, before the model takes one), one
        # runs: a few are served, most of the spike is refused
        assert 2 <= statuses.count(200) <= 6, statuses
        refused = [(took, r) for status, took, r in answers if status == 429]
        assert max(took for took, _ in refused) < MODEL_S  # refused at once, not after a wait
        for _, r in refused:
            assert r.headers["Retry-After"] == "1"
            assert "max_queue=2" in r.json()["error"]
        # gRPC, while three requests hold the model and the queue
        with grpc.insecure_channel(served.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="slow")
            tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
            tensor.contents.fp32_contents.append(1.5)
            busy = []
            for _ in range(3):  # one after another: the first reaches the model, two wait
                busy.append(stub.ModelInfer.future(request, timeout=30))
                time.sleep(0.05)
            try:
                stub.ModelInfer(request, timeout=30)
                raise AssertionError("a fourth request was admitted past max_queue=2")
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
                assert ("retry-after", "1") in tuple(err.trailing_metadata())
            assert [f.result().outputs[0].name for f in busy] == ["y"] * 3
            assert stub.ModelInfer(request, timeout=30).outputs[0].name == "y"
        good = httpx.post(f"{served.http_url}/v2/models/slow/infer", json=ROW, timeout=30)
        assert good.status_code == 200, good.text
        assert good.json()["outputs"][0]["data"] == [3.0]
