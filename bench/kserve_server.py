"""Serve a model repository over KServe v2 (HTTP + gRPC) for the benchmarks.

    python -m bench.kserve_server --repository DIR --http-port 8000 --grpc-port 8001 [MODEL ...]

Uses the same router and gRPC server `podium serve` mounts, without the OpenAI layer, so the
figures measure the KServe path alone.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from podium.frontends.kserve_grpc import create_server
from podium.frontends.kserve_http import create_router
from podium.repository import ModelRepository, scan_repository


def command(repository: Path, http_port: int, grpc_port: int, models: list[str]) -> list[str]:
    """The command line that serves `models` of `repository` with this interpreter."""
    return [sys.executable, "-m", "bench.kserve_server", "--repository", str(repository),
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), *models]


def ready_url(http_port: int) -> str:
    return f"http://127.0.0.1:{http_port}/v2/health/ready"


def build_app(repository_dir: Path, models: list[str], grpc_port: int) -> FastAPI:
    repository = ModelRepository(root=repository_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        repository.register(scan_repository(repository_dir))
        for name in models:
            await repository.load_model(name)
        grpc_server = create_server(repository, port=grpc_port, host="127.0.0.1",
                                    server_ready=repository.all_ready)
        await grpc_server.start()
        print("ready", flush=True)
        yield
        await grpc_server.stop(grace=1)
        await repository.unload_all(timeout_s=5)

    app = FastAPI(lifespan=lifespan)
    app.include_router(create_router(repository, server_ready=repository.all_ready))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    app = build_app(args.repository, args.models, args.grpc_port)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.http_port, log_level="warning",
                            access_log=False)
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
