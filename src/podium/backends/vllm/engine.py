"""The engine of a vLLM package: vLLM's own argument namespace built from the manifest
(`build_engine_args`) and `AsyncLLM` started from it (`_start_engine`), the same for an
instance's boot and the announce-time compile job (`compile_job`)."""

from __future__ import annotations

import logging
import os
from argparse import Namespace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.backends.limits import (
    DEFAULT_MAX_NUM_QUEUED_REQS,
    DEFAULT_MAX_NUM_QUEUED_TOKENS,
    InstanceLimits,
    resolve,
)
from podium.boot_timeline import substep
from podium.errors import BootError, PackageError
from podium.package.manifest import VllmManifest

if TYPE_CHECKING:
    from podium.backends.vllm.worker_threads import WorkerThreads

log = logging.getLogger("podium.backends.vllm")


def build_engine_args(manifest: VllmManifest, weights_dir: str,
                      limits: InstanceLimits | None = None) -> Namespace:
    """vLLM's own CLI namespace for this model, with the manifest's engine args applied and
    vLLM's admission control on (limits: the flag's, else the package's, else the default)."""
    parser = _arg_parser(manifest.frontends)
    args = parser.parse_args(["--model", weights_dir, "--served-model-name", manifest.name])
    if manifest.task == "embed":
        args.runner = "pooling"
    for key, value in _precision_args(manifest, Path(weights_dir)).items():
        setattr(args, key, value)
    for key, value in manifest.engine_args.items():
        attr = key.replace("-", "_")
        if not hasattr(args, attr):
            raise PackageError(_unknown_engine_arg(key, manifest.frontends),
                               param=f"engine_args.{key}")
        setattr(args, attr, value)
    if manifest.lora is not None and manifest.task == "generate":
        for key, value in manifest.lora.engine_args().items():
            setattr(args, key, value)
    limits = limits or InstanceLimits()
    args.max_num_queued_reqs = resolve(limits.max_num_queued_reqs, manifest.max_num_queued_reqs,
                                       DEFAULT_MAX_NUM_QUEUED_REQS)
    args.max_num_queued_tokens = resolve(limits.max_num_queued_tokens,
                                         manifest.max_num_queued_tokens,
                                         DEFAULT_MAX_NUM_QUEUED_TOKENS)
    return args


def _arg_parser(frontends: str) -> Any:
    """vLLM's argument parser: the API server's (engine + OpenAI frontend arguments) for an
    embedded package, the engine's alone for a standalone one (it imports no OpenAI layer)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="podium")
    if frontends == "standalone":
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs.add_cli_args(parser)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

    parser = make_arg_parser(parser)
    parser.set_defaults(disable_uvicorn_access_log=True)
    return parser


def _unknown_engine_arg(key: str, frontends: str) -> str:
    if frontends == "standalone":
        openai_args = vars(_arg_parser("embedded").parse_args(["--model", "x"]))
        if key.replace("-", "_") in openai_args:
            return (f"engine_args.{key} is an argument of vLLM's OpenAI frontend, which a "
                    "standalone package does not run; remove it, or set frontends to "
                    "\"embedded\"")
    return (f"engine_args.{key} is not a vLLM {_engine_version()} engine argument; see "
            "`python -m vllm.entrypoints.openai.api_server --help` for the names")

def _precision_args(manifest: VllmManifest, weights_dir: Path) -> dict[str, Any]:
    """vLLM's dtype/quantization for the package's precision, checked again on the machine
    that boots it (the one that announced it may be of another kind); `auto` resolved for
    these weights on this machine, in one log line."""
    from podium.package import precision

    if manifest.precision == precision.AUTO:
        if any(key in manifest.engine_args or key.replace("_", "-") in manifest.engine_args
               for key in precision.ENGINE_ARGS):
            return {}  # the author chose the dtype
        resolved = precision.resolve_auto(weights_dir)
        log.info("%s", resolved.describe(f"{manifest.name}@{manifest.version}"))
        return resolved.precision.engine_args() if resolved.precision else {}
    try:
        precision.check(manifest.precision)
    except ValueError as exc:
        raise PackageError(f"{manifest.name}: {exc}", param="precision") from None
    return precision.PRECISIONS[manifest.precision].engine_args()


def _start_engine(args: Namespace, threads: WorkerThreads | None = None) -> Any:
    """vLLM's AsyncLLM from these args, its worker's threads bound as chosen (`threads`)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from podium.engine_patches.lifecycle import PARENT_ENV

    os.environ[PARENT_ENV] = str(os.getpid())  # its engine core follows this process
    engine_args = AsyncEngineArgs.from_cli_args(args)
    from podium.backends.vllm.worker_threads import environment
    from podium.preload import engine_context

    with environment(threads):
        try:
            with substep("engine config"):
                config = engine_args.create_engine_config(
                    usage_context=UsageContext.OPENAI_API_SERVER)
        except Exception as exc:  # vLLM validates args here: name the problem, don't half-serve
            raise BootError(f"vLLM rejected the engine configuration: {exc}") from exc
        # the engine core's process (forked from the preloader when one runs) and its
        # worker: weights, KV cache, profile; vLLM's own log times each of those
        with substep("engine core up"), engine_context():
            return AsyncLLM.from_vllm_config(
                vllm_config=config,
                usage_context=UsageContext.OPENAI_API_SERVER,
                enable_log_requests=False,
                disable_log_stats=False,
            )


def _engine_version() -> str:
    from podium.engine import ENGINE_VERSION

    return ENGINE_VERSION
