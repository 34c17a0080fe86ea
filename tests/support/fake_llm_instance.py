"""One instance over a fake-engine LLM, in process: the app over httpx's ASGI transport and
a gRPC port on loopback, with any `ServerConfig` settings (limits, queue bounds)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from podium.frontends.kserve_grpc import create_server
from podium.package.package import open_package, write_manifest
from podium.server.app import build_app
from podium.server.config import ServerConfig
from podium.server.instance import Instance
from tests.support.fake_llm import FakeEngine, FakeLlmBackend
from tests.support.openai_instance import client_for
from tests.support.ports import free_port


class RefusingEngine(FakeEngine):
    """The fake engine with vLLM's admission control: it refuses while `refusal` is set, in
    `generate`'s first step, as AsyncLLM.add_request does."""

    refusal: type[Exception] | None = None

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str
                       ) -> AsyncIterator[Any]:
        if self.refusal is not None:
            raise self.refusal()
        async for output in super().generate(prompt, sampling_params, request_id):
            yield output


@contextlib.asynccontextmanager
async def llm_instance(tmp_path: Path, manifest: dict[str, Any] | None = None,
                       engine: RefusingEngine | None = None, **config: Any
                       ) -> AsyncIterator[tuple[Any, Any, str]]:
    """An instance app and a gRPC port over one fake-engine LLM: (http client, engine, grpc
    target); `manifest` adds fields to the LLM's podium.json; `engine`: another fake."""
    manifest = manifest or {}
    package = open_package(write_manifest(tmp_path / "llm", {
        "name": "llm", "version": "1", "backend": "vllm",
        "weights": {"source": "path", "path": "/nonexistent/fake.gguf"}, **manifest}).root)
    instance = Instance(ServerConfig(grpc_port=-1, **config))
    engine = engine or RefusingEngine()
    await instance.repository.load(package, backend=FakeLlmBackend(package, engine=engine))
    async with served(instance) as (client, grpc_url):
        yield client, engine, grpc_url


@contextlib.asynccontextmanager
async def served(instance: Instance) -> AsyncIterator[tuple[Any, str]]:
    """A loaded instance marked booted, served: (httpx client over its app, gRPC HOST:PORT)."""
    instance.booted = True
    port = free_port()
    server = create_server(instance.repository, port=port, host="127.0.0.1",
                           server_ready=instance.is_ready)
    await server.start()
    try:
        async with client_for(build_app(instance)) as client:
            yield client, f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=1)
