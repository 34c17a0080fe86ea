"""A batched model never hangs its callers: an empty batch is a 400, and a batcher that dies
for good turns the model (and the server) not ready while every request fails fast."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from fastapi import FastAPI
from tritonclient.utils import InferenceServerException

from podium.examples.builders import synthetic_features
from podium.frontends.kserve_http import create_router
from podium.repository import ModelRepository
from tests.support.kserve_instance import Instance

ROWS = synthetic_features(2, seed=3)


def _infer_body(rows: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": "features", "datatype": "FP32", "shape": list(rows.shape),
                        "data": rows.ravel().tolist()}]}


def test_an_empty_batch_over_http_and_grpc_leaves_the_model_and_its_ensemble_serving(
        kserve_instance: Instance) -> None:
    empty = np.zeros((0, 20), dtype=np.float32)
    reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/xgb-example/infer",
                       json=_infer_body(empty), timeout=10)
    assert reply.status_code == 400, reply.text
    assert "empty batch" in reply.json()["error"]
    client = grpcclient.InferenceServerClient(kserve_instance.grpc_url)
    tensor = grpcclient.InferInput("features", [0, 20], "FP32")
    tensor.set_data_from_numpy(empty)
    with pytest.raises(InferenceServerException, match="empty batch"):
        client.infer("xgb-example", [tensor], client_timeout=10)
    # the batched model and the ensemble that calls it both still answer, within seconds
    for model in ("xgb-example", "python-example"):
        reply = httpx.post(f"http://{kserve_instance.http_url}/v2/models/{model}/infer",
                           json=_infer_body(ROWS), timeout=10)
        assert reply.status_code == 200, reply.text
    assert httpx.get(f"http://{kserve_instance.http_url}/v2/health/ready").status_code == 200


async def _kill_the_batcher(examples_dir: Path) -> dict[str, Any]:
    """Serve xgb-example and its ensemble, kill xgb's batcher task mid-request with no
    restarts left, then see what clients see."""
    repository = ModelRepository(root=examples_dir)
    await repository.load_model("xgb-example")
    await repository.load_model("python-example")
    app = FastAPI()
    app.include_router(create_router(repository, server_ready=repository.all_ready))
    seen: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://podium", timeout=10) as client:
            async def infer(model: str) -> httpx.Response:
                return await asyncio.wait_for(
                    client.post(f"/v2/models/{model}/infer", json=_infer_body(ROWS)), 10)

            assert (await infer("xgb-example")).status_code == 200  # starts the batcher
            batcher = repository.find("xgb-example").backend._batcher
            batcher.max_restarts = 0
            real = batcher._run_batch
            busy, release = threading.Event(), threading.Event()
            batcher._run_batch = lambda items: (busy.set(), release.wait(10), real(items))[2]
            waiting = asyncio.create_task(infer("xgb-example"))
            assert await asyncio.to_thread(busy.wait, 10), "the request never reached the model"
            batcher._task.cancel()
            seen["waiting"] = await waiting
            # answered while the test still held its model call: it failed at once
            seen["answered_while_held"] = not release.is_set()
            release.set()
            seen["ready"] = (await client.get("/v2/health/ready")).status_code
            seen["model_ready"] = (await client.get("/v2/models/xgb-example/ready")).status_code
            seen["index"] = (await client.post("/v2/repository/index", json={})).json()
            seen["later"] = await infer("xgb-example")
            seen["ensemble"] = await infer("python-example")
    finally:
        await repository.unload_all(timeout_s=5)
    return seen


def test_a_dead_batcher_makes_the_model_not_ready_and_requests_fail_fast(
        examples_dir: Path) -> None:
    seen = asyncio.run(_kill_the_batcher(examples_dir))
    assert seen["waiting"].status_code == 503  # BackendDead: try another instance
    assert "xgb-example@1 is dead" in seen["waiting"].json()["error"]
    assert seen["answered_while_held"]
    assert seen["ready"] == 503
    assert seen["model_ready"] != 200
    state = {row["name"]: row for row in seen["index"]}
    assert state["xgb-example"]["state"] == "UNAVAILABLE"
    assert "died" in state["xgb-example"]["reason"]
    assert state["python-example"]["state"] == "READY"
    assert seen["later"].status_code == 503, seen["later"].text
    # the ensemble's call into the dead model fails at once instead of waiting out its 60 s
    # timeout (`infer` gives up after 10 s), with an error naming the dead model
    assert seen["ensemble"].status_code >= 500
    assert "xgb-example" in seen["ensemble"].json()["error"]
