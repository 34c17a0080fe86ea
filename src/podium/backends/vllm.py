"""The vLLM backend: the engine embedded in the instance, served through vLLM's own classes.

Load builds vLLM's argument namespace from the manifest, starts `AsyncLLM` (its engine core
runs in a spawned child process), then lets vLLM's `init_app_state` build the OpenAI serving
objects (chat, completions, embeddings, models) for this one model. Podium routes requests to
them; request models, sampling, structured outputs and streaming are vLLM's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from argparse import Namespace
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.limits import (
    DEFAULT_MAX_NUM_QUEUED_REQS,
    DEFAULT_MAX_NUM_QUEUED_TOKENS,
    InstanceLimits,
    resolve,
)
from podium.errors import BackendDead, BackendError, BootError, InvalidArgument, PackageError
from podium.package.manifest import TensorSpec, VllmManifest

log = logging.getLogger("podium.backends.vllm")
ENGINE_STOP_S = 15.0
"""How long vLLM's own shutdown may take before it kills the engine core. Its default, 5 s, is
shorter than the engine core's teardown here (5.3 s: the worker takes 3 s to exit), so every
stop ended in "force killing remaining process EngineCore" and a leaked shared-memory segment.
A server's whole stop stays bounded by its `--shutdown-timeout` watchdog."""


class VllmBackend(Backend):
    """An LLM or embedding model on the embedded vLLM engine."""

    decoupled = True

    def __init__(self, package) -> None:
        super().__init__(package)
        assert isinstance(self.manifest, VllmManifest)
        self.engine: Any = None
        self.state: Any = None
        self.args: Namespace | None = None
        self.supported_tasks: tuple[str, ...] = ()

    @property
    def platform(self) -> str:
        return "vllm"

    @property
    def task(self) -> str:
        return self.manifest.task

    async def load(self) -> None:
        from podium.package.cache import ModelCache

        cache = ModelCache()
        weights = cache.lookup(self.package)
        if weights is None:
            log.info("%s is not in the cache yet: materializing it now (run `podium "
                     "materialize` when announcing to keep this off the boot path)",
                     self.package.key)
            weights = (await asyncio.to_thread(cache.materialize, self.package)).path
        self.args = build_engine_args(self.manifest, str(weights), self.limits)
        from podium.package import compiled

        args = self.args
        job = compiled.prepare(self.package, weights, args)  # engine mode, compile cache
        # AsyncLLM's constructor blocks until the engine core is up (tens of seconds):
        # build it off the event loop so liveness keeps answering during boot.
        self.engine = await asyncio.to_thread(compiled.start, job, lambda: _start_engine(args))
        catalog = asyncio.ensure_future(self._prepare_constraints())  # beside the rest
        try:
            self.supported_tasks = tuple(await self.engine.get_supported_tasks())
            if self.manifest.frontends == "embedded":  # standalone: KServe only, no OpenAI
                self.state = await self._openai_state()
            await self._warm_up()
        except BaseException:
            catalog.cancel()
            raise
        await catalog

    async def _prepare_constraints(self) -> None:
        """The package's constraint catalog, if it names one, read, checked and tokenized
        where this instance compiles constraints (``ConstraintPrecompiler.prepare``)."""
        name = self.manifest.constraint_catalog
        if name is None or self.task != "generate":
            return
        from podium.constraints.precompile import precompiler_for
        from podium.package.catalog import FIELD, read_catalog
        from podium.package.paths import named_path

        root = self.package.root
        path = named_path(root, name, FIELD)
        strings = await asyncio.to_thread(read_catalog, path, root)
        config = self.engine.model_config
        compiler = precompiler_for(str(config.tokenizer), int(config.get_vocab_size()))
        await compiler.prepare(path, strings)

    async def _openai_state(self) -> Any:
        """vLLM's OpenAI serving objects (chat, completions, embeddings) for this model."""
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        state = State()
        await init_app_state(self.engine, state, self.args, self.supported_tasks)
        return state

    async def unload(self) -> None:
        engine, self.engine, self.state = self.engine, None, None
        if engine is not None:
            await _stop_output_handler(engine)
            await asyncio.to_thread(engine.shutdown, ENGINE_STOP_S)

    @property
    def openai(self) -> Any | None:
        return self.state

    @property
    def seed_crashes_engine(self) -> bool:
        """vLLM 0.32's CPU runner kills the engine when a seeded request is prefilled in
        chunks (`CPU Generator does not use offset`). Podium's engine plugin
        (`engine_patches.cpu_seed`) fixes that for the pinned engine; only an engine it does
        not patch still refuses such requests."""
        if self.engine is None:
            return False
        config = self.engine.vllm_config
        if (config.device_config.device_type != "cpu"
                or not config.scheduler_config.enable_chunked_prefill):
            return False
        from podium.engine_patches import cpu_seed

        return not cpu_seed.applies()

    def check_seed(self, seed: object) -> None:
        if seed is not None and self.seed_crashes_engine:
            raise InvalidArgument(
                f"seed is not supported by {self.package.key}: on CPU, vLLM {_engine_version()} "
                "crashes when a seeded request is prefilled in chunks and Podium's fix does "
                "not apply to this engine version; remove seed, or serve the package with "
                "engine_args enable_chunked_prefill=false", param="seed")

    def is_alive(self) -> bool:
        """False once the engine has died (the instance must restart)."""
        return self.engine is not None and not getattr(self.engine, "errored", False)

    @property
    def max_model_len(self) -> int:
        return int(self.engine.model_config.max_model_len) if self.engine else 0

    def inputs(self) -> list[TensorSpec]:
        from podium.backends import vllm_contract

        return vllm_contract.input_specs(self.task)

    def outputs(self) -> list[TensorSpec]:
        from podium.backends import vllm_contract

        return vllm_contract.output_specs(self.task)

    @property
    def optional_inputs(self) -> frozenset[str]:
        """The optional tensors of Triton's vLLM contract (stream, sampling_parameters, …)."""
        from podium.backends import vllm_contract

        return vllm_contract.optional_inputs(self.task)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        from podium.backends import vllm_contract

        self._check_alive()
        with self._engine_errors():
            return await vllm_contract.infer(self.engine, request, task=self.task,
                                            sampling_params=self._sampling_params,
                                            caps=self.generation_caps)

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        from podium.backends import vllm_contract

        self._check_alive()
        with self._engine_errors():
            async for response in vllm_contract.infer_stream(
                    self.engine, request, task=self.task, sampling_params=self._sampling_params,
                    caps=self.generation_caps):
                yield response

    @property
    def generation_caps(self) -> Any:
        """`n` and stop-list caps of KServe requests: the OpenAI routes' values."""
        from podium.backends.vllm_checks import generation_caps

        return generation_caps(self.limits, self.manifest.max_n)

    @contextlib.contextmanager
    def _engine_errors(self) -> Iterator[None]:
        """vLLM's two engine errors in Podium's terms: EngineDeadError is fatal (BackendDead),
        EngineGenerateError fails this request only (BackendError); a request vLLM refuses
        (VLLMValidationError: scoring or embedding past the context, …) is a 400."""
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        from podium.backends.vllm_checks import engine_rejections

        try:
            with engine_rejections():
                yield
        except EngineDeadError as exc:
            raise BackendDead(f"the engine of {self.package.key} died: {exc}") from exc
        except EngineGenerateError as exc:
            raise BackendError(f"the engine of {self.package.key} failed this request: "
                               f"{exc}") from exc

    def _sampling_params(self, **kwargs: Any) -> Any:
        from vllm import SamplingParams

        self.check_seed(kwargs.get("seed"))
        return SamplingParams(**kwargs)

    def _check_alive(self) -> None:
        if not self.is_alive():
            raise BackendDead(f"the engine of {self.package.key} is not running")

    async def _warm_up(self) -> None:
        """One tiny request through the whole engine path before reporting ready."""
        from vllm import PoolingParams, SamplingParams

        if self.task == "embed":
            stream = self.engine.encode("warm up", PoolingParams(task="embed"),
                                        request_id="podium-warmup")
        else:
            stream = self.engine.generate("warm up", SamplingParams(max_tokens=1),
                                          request_id="podium-warmup")
        async for _ in stream:
            pass


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


def _start_engine(args: Namespace) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from podium.engine_patches.lifecycle import PARENT_ENV

    os.environ[PARENT_ENV] = str(os.getpid())  # its engine core follows this process
    engine_args = AsyncEngineArgs.from_cli_args(args)
    try:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as exc:  # vLLM validates args here: name the problem, don't half-serve
        raise BootError(f"vLLM rejected the engine configuration: {exc}") from exc
    return AsyncLLM.from_vllm_config(
        vllm_config=config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=False,
        disable_log_stats=False,
    )


def _engine_version() -> str:
    from podium.engine import ENGINE_VERSION

    return ENGINE_VERSION


async def _stop_output_handler(engine: Any) -> None:
    """Cancel vLLM's output handler before its engine core is stopped. `AsyncLLM.shutdown`
    stops the core first and cancels the handler after, so on every clean stop the handler,
    still reading, met the dead core and logged `AsyncLLM output_handler failed ...
    EngineDeadError` at ERROR: an operator's alerting fired on a healthy rollout. Nothing is
    in flight by now (the server drained first), so there is nothing left to read."""
    handler = getattr(engine, "output_handler", None)
    if handler is None or handler.done():
        return
    handler.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await handler
