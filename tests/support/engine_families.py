"""The vllm:* families (with their label names) vLLM's stat loggers register for an engine of
a package, found without starting the engine: the package's engine config is built as an
instance's boot builds it (`build_engine_args`, `create_engine_config`), and vLLM's
`StatLoggerManager` is made from it as `AsyncLLM` makes it (the plugins' loggers included),
in a process of its own so the registry starts empty.

Run as a script: `python tests/support/engine_families.py PACKAGE_DIR WEIGHTS_DIR`; prints one
JSON line `{family: sorted label names}` (tests/metrics/test_engine_metrics.py compares it
with what the shared instance's /metrics exposes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.support import background


def registered(package_dir: Path, weights_dir: Path) -> dict[str, list[str]]:
    from prometheus_client import REGISTRY
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.metrics.loggers import StatLoggerManager, load_stat_logger_plugin_factories

    from podium.backends.vllm.engine import build_engine_args
    from podium.package.package import open_package
    from tests.support.engine_probe import label_names

    manifest = open_package(package_dir).manifest
    args = build_engine_args(manifest, str(weights_dir))  # type: ignore[arg-type]
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER)
    if config.cache_config.num_gpu_blocks is None:  # the engine sets it once its cache is up
        config.cache_config.num_gpu_blocks = 1
    manager = StatLoggerManager(vllm_config=config, engine_idxs=[0],
                                custom_stat_loggers=load_stat_logger_plugin_factories())
    manager.log_engine_initialized()
    return label_names(REGISTRY.collect())


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # an in-memory registry, read here
    families = registered(Path(sys.argv[1]), Path(sys.argv[2]))
    sys.stdout.write("\n" + json.dumps(families) + "\n")
    sys.stdout.flush()


def start(package_dir: Path, weights_dir: Path, workdir: Path) -> background.Job:
    """This script for the package, as a background job of the session (tests/conftest.py
    starts it at the session's first test: ~13 s of vLLM's import and config on one core)."""
    return background.start("engine_families", [sys.executable, "-m",
                                                "tests.support.engine_families",
                                                str(package_dir), str(weights_dir)], workdir)


def read(job: background.Job) -> dict[str, list[str]]:
    """The families the job printed."""
    return json.loads(job.stdout().strip().splitlines()[-1])


if __name__ == "__main__":
    main()
