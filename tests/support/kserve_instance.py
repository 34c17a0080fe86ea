"""A real instance for the protocol tests: uvicorn + gRPC on loopback ports, serving the
example repository (classic backends) and a fake-engine LLM (the `kserve_instance` fixture)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from podium.edge.head import bounded_head_protocol
from podium.frontends.kserve_grpc import create_server
from podium.frontends.kserve_http import create_router
from podium.frontends.kserve_limits import KServeLimits
from podium.package.package import write_manifest
from podium.repository import ModelRepository, scan_repository
from tests.support.fake_llm import FakeLlmBackend
from tests.support.ports import free_port

CLASSIC = ["xgb-example", "torch-example", "onnx-example", "python-example"]
LLM = "fake-llm"
MiB = 1024 * 1024
LIMITS = KServeLimits(max_body_bytes=2 * MiB, max_inflated_bytes=4 * MiB, max_json_depth=64,
                      max_tensors=16, max_elements=1_000_000, grpc_max_message_bytes=4 * MiB)
"""Smaller than the defaults, so the tests reach each limit with small requests."""
MAX_HEADER_BYTES = 16 * 1024
EMBEDDER = "fake-embedder"


@dataclass
class Instance:
    """A running instance and a way to run coroutines on its event loop."""

    repository: ModelRepository
    http_url: str
    grpc_url: str
    loop: asyncio.AbstractEventLoop
    llm: FakeLlmBackend | None = None

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


def reference_xgb(examples_dir: Path, features: np.ndarray) -> np.ndarray:
    """What the xgboost example answers for `features`, computed by xgboost itself."""
    import xgboost

    booster = xgboost.Booster(model_file=str(examples_dir / "xgb-example" / "model.json"))
    return booster.inplace_predict(features).reshape(-1, 1)


@contextmanager
def serving(examples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    """Serve the examples and two fake-engine LLMs until the block ends."""
    repository = ModelRepository(root=examples_dir)
    http_port, grpc_port = free_port(), free_port()
    llm_dir = tmp_path_factory.mktemp("fake-llm")
    llm_package = write_manifest(llm_dir, {
        "name": LLM, "version": "1", "backend": "vllm",
        "weights": {"source": "path", "path": "/nonexistent/fake.gguf"}})
    embed_package = write_manifest(tmp_path_factory.mktemp("fake-embedder"), {
        "name": EMBEDDER, "version": "1", "backend": "vllm", "task": "embed",
        "weights": {"source": "path", "path": "/nonexistent/embedder"}})
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        repository.register(scan_repository(examples_dir))
        for name in CLASSIC:
            await repository.load_model(name)
        state["llm"] = FakeLlmBackend(llm_package)
        await repository.load(llm_package, backend=state["llm"])
        await repository.load(embed_package, backend=FakeLlmBackend(embed_package))
        grpc_server = create_server(repository, port=grpc_port, host="127.0.0.1",
                                    server_ready=repository.all_ready, limits=LIMITS)
        await grpc_server.start()
        state["loop"] = asyncio.get_running_loop()
        yield
        await grpc_server.stop(grace=1)
        await repository.unload_all(timeout_s=5)

    app = FastAPI(lifespan=lifespan)
    app.include_router(create_router(repository, server_ready=repository.all_ready,
                                     limits=LIMITS))
    server = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=http_port, log_level="warning", lifespan="on",
        http=bounded_head_protocol(MAX_HEADER_BYTES, server="the instance",
                                   flag="--max-header-bytes")))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started:
            break
        if not thread.is_alive():
            raise RuntimeError("the test instance failed to start")
        threading.Event().wait(0.05)
    else:
        raise RuntimeError("the test instance did not start within 30 s")
    yield Instance(repository, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}",
                   state["loop"], state["llm"])
    server.should_exit = True
    thread.join(timeout=15)
