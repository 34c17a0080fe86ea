"""A request for the latest version learns which version served it, over HTTP and gRPC."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from fastapi import FastAPI

from podium.frontends.kserve_grpc import create_server
from podium.frontends.kserve_http import create_router
from podium.repository import ModelRepository, VersionPolicy
from tests.support.ports import free_port
from tests.support.versioned import write_versioned


def _grpc_input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    return tensor


async def test_unversioned_requests_name_the_version_that_served(tmp_path: Path) -> None:
    for version in ("1", "2"):
        write_versioned(tmp_path / "m" / version, "m", version)
    repository = ModelRepository(root=tmp_path)
    await repository.load_model("m", VersionPolicy.parse({"all": {}}))
    app = FastAPI()
    app.include_router(create_router(repository, server_ready=repository.all_ready))
    port = free_port()
    grpc_server = create_server(repository, port=port, host="127.0.0.1",
                                server_ready=repository.all_ready)
    await grpc_server.start()
    grpc = aiogrpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0]}]}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as http:
            for latest in ("2", "1"):  # the newest, then the one left after unloading it
                r = (await http.post("/v2/models/m/infer", json=body)).json()
                assert (r["model_version"], r["outputs"][0]["data"]) == (latest, [float(latest)])
                result = await grpc.infer("m", [_grpc_input()])
                assert result.get_response().model_version == latest
                assert result.as_numpy("version").tolist() == [[float(latest)]]
                if latest == "2":
                    await repository.unload("m", "2")
    finally:
        await grpc.close()
        await grpc_server.stop(grace=1)
        await repository.unload_all()
