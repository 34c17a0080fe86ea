"""Boot a real vLLM engine the way an instance does and report what /metrics exposes.

Run as a script (vLLM spawns its engine core, so this needs its own interpreter and a main
guard): `python tests/support/engine_probe.py MODEL_DIR METRICS_BASE [--write-fixture PATH]`.
Prints one JSON document: the vllm:* families the engine registered (with label names), the
families found in the multiprocess directory, and the /metrics bodies in both formats.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path


def label_names(families) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """{family: sorted label names} for vllm:* families, ignoring the histogram `le`."""
    return {
        f.name: sorted({k for s in f.samples for k in s.labels if k != "le"})
        for f in families
        if f.name.startswith("vllm:")
    }


async def probe(model_dir: str, base: Path) -> dict:
    from podium.metrics.multiproc import prepare_multiproc_dir

    # First, as in the instance's boot: before anything imports prometheus_client.
    metrics_dir = prepare_multiproc_dir(base)

    import httpx
    from fastapi import FastAPI
    from prometheus_client import REGISTRY
    from prometheus_client.multiprocess import MultiProcessCollector
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    from podium.metrics import exposition, server

    argv = [
        "--model",
        model_dir,
        "--served-model-name",
        "smol",
        "--enforce-eager",
        "--max-model-len",
        "2048",
    ]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    ctx = UsageContext.OPENAI_API_SERVER
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=ctx)
    llm = AsyncLLM.from_vllm_config(vllm_config=config, usage_context=ctx, disable_log_stats=False)
    try:
        for i in range(2):
            params = SamplingParams(max_tokens=8)
            async for _ in llm.generate("The capital of France is", params, request_id=f"p{i}"):
                pass
        server.observe_request("openai", "/v1/completions", "smol", "1", 200, 0.3)
        server.set_ready(True)
        app = FastAPI()
        app.include_router(exposition.create_router())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
            text = await client.get("/metrics")
            om = await client.get(
                "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
        return {
            "metrics_dir": str(metrics_dir),
            "pid": os.getpid(),
            "files": sorted(os.listdir(metrics_dir)),
            "registered": label_names(REGISTRY.collect()),
            "in_directory": label_names(MultiProcessCollector(None, str(metrics_dir)).collect()),
            "text": text.text,
            "text_content_type": text.headers["content-type"],
            "openmetrics": om.text,
            "openmetrics_content_type": om.headers["content-type"],
        }
    finally:
        llm.shutdown()


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model_dir, base = sys.argv[1], Path(sys.argv[2])
    result = asyncio.run(probe(model_dir, base))
    if "--write-fixture" in sys.argv:
        Path(sys.argv[sys.argv.index("--write-fixture") + 1]).write_text(result["text"])
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vLLM's atexit hooks can hang on a 2-core box; the probe is done


if __name__ == "__main__":
    main()
