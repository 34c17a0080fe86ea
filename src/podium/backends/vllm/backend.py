"""The vLLM backend: the engine embedded in the instance, served through vLLM's own classes.

Load builds vLLM's argument namespace from the manifest, starts `AsyncLLM` (its engine core
runs in a spawned child process), then lets vLLM's `init_app_state` build the OpenAI serving
objects (chat, completions, embeddings, models) for this one model, served as its
`OpenAIService` (`openai.VllmOpenAI`). KServe requests go through `contract`. Request models,
sampling, structured outputs and streaming are vLLM's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from argparse import Namespace
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from podium.backends.base import AdapterCard, Backend, InferenceRequest, InferenceResponse
from podium.backends.limits import InstanceLimits
from podium.backends.openai_service import OpenAIService
from podium.backends.vllm.engine import _engine_version, _start_engine, build_engine_args
from podium.boot_timeline import substep
from podium.errors import BackendDead, BackendError, InvalidArgument, PodiumError
from podium.package.manifest import TensorSpec, VllmManifest

if TYPE_CHECKING:
    from podium.backends.vllm.admission import Bounds, Rates
    from podium.backends.vllm.lora import Adapters
    from podium.backends.vllm.sizing import Sizing

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
        self._openai: OpenAIService | None = None
        self.args: Namespace | None = None
        self.supported_tasks: tuple[str, ...] = ()
        self._adapters: Adapters | None = None
        self.admission: Bounds | None = None
        """The admission bounds in force and the rates they came from (after load)."""
        self._sizing: Sizing | None = None

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
        from podium.backends.vllm import engine_build

        with substep("engine args"):  # vLLM's parser, precision, mode, worker threads
            self.args = args = build_engine_args(self.manifest, str(weights), self.limits)
            job = engine_build.prepare(self.package, weights, args)  # mode, compile cache
            threads = engine_build.worker_threads(self.package)
        from podium.backends.vllm.sizing import Sizing

        self._sizing = Sizing(self, threads)
        # AsyncLLM's constructor blocks until the engine core is up (tens of seconds):
        # build it off the event loop so liveness keeps answering during boot.
        self.engine = await asyncio.to_thread(engine_build.start, job,
                                              lambda: _start_engine(args, threads))
        catalog = asyncio.ensure_future(self._prepare_constraints())  # beside the rest
        try:
            with substep("supported tasks"):
                self.supported_tasks = tuple(await self.engine.get_supported_tasks())
            if self.manifest.frontends == "embedded":  # standalone: KServe only, no OpenAI
                from podium.backends.vllm.openai import VllmOpenAI

                with substep("OpenAI serving objects"):
                    self._openai = VllmOpenAI(self, await self._openai_state())
            with substep("warm-up request"):
                await self._warm_up()
            with substep("admission probe") as detail:
                await self._sizing.size_at_boot()
                detail.append("measured now" if self.admission is None
                              or self.admission.measured_at is None else "cached")
            if self.manifest.lora is not None and self.task == "generate":
                from podium.backends.vllm.lora import Adapters

                self._adapters = Adapters(self)
        except BaseException:
            catalog.cancel()
            raise
        await catalog

    def admission_rates(self) -> Rates | None:
        """The measured rates in force (deadline checks read them per request)."""
        return self.admission.rates if self.admission is not None else None

    def config(self) -> dict[str, Any]:
        """Triton's model configuration, with the admission bounds in force and the measured
        rates behind them (`admission`)."""
        config = super().config()
        if self.admission is not None:
            config["admission"] = self.admission.as_dict()
        return config

    async def _prepare_constraints(self) -> None:
        """The package's constraint catalog, if it names one, prepared where this instance
        compiles constraints (`constraint.prepare_catalog`)."""
        name = self.manifest.constraint_catalog
        if name is None or self.task != "generate":
            return
        from podium.backends.vllm import constraint

        with substep("constraint catalog (beside the rest)"):
            await constraint.prepare_catalog(self.package.root, name, self.engine)

    async def _openai_state(self) -> Any:
        """vLLM's OpenAI serving objects (chat, completions, embeddings) for this model."""
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        from podium.backends.vllm import refusal_logs

        refusal_logs.install()  # a refusal inside vLLM's stream logs no ERROR traceback
        state = State()
        await init_app_state(self.engine, state, self.args, self.supported_tasks)
        return state

    async def unload(self) -> None:
        if self._sizing is not None:
            self._sizing.cancel()
        engine, self.engine, self._openai = self.engine, None, None
        if engine is not None:
            await _stop_output_handler(engine)
            await asyncio.to_thread(engine.shutdown, ENGINE_STOP_S)

    @property
    def openai(self) -> OpenAIService | None:
        return self._openai

    def adapter(self, name: str, version: str | None) -> Backend | None:
        """The view serving LoRA adapter name[@version] of this model, found in the cache on
        each call (an adapter announced after boot is served at once); None without one."""
        return self._adapters.find(name, version) if self._adapters is not None else None

    @property
    def serves_adapters(self) -> bool:  # type: ignore[override]
        return self._adapters is not None

    def adapters(self) -> list[AdapterCard]:
        if self._adapters is None:
            return []
        return [AdapterCard(a.info.name, a.info.version, a.info.rank)
                for a in self._adapters.listed()]

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

    def refusal(self) -> PodiumError | None:
        """The engine's admission check (`checks.room_refusal`): its 429 while it is full."""
        from podium.backends.vllm.checks import room_refusal

        return room_refusal(self.engine) if self.engine is not None else None

    def is_alive(self) -> bool:
        """False once the engine has died (the instance must restart)."""
        return self.engine is not None and not getattr(self.engine, "errored", False)

    @property
    def max_model_len(self) -> int:
        return int(self.engine.model_config.max_model_len) if self.engine else 0

    def inputs(self) -> list[TensorSpec]:
        from podium.backends.vllm import contract

        return contract.input_specs(self.task)

    def outputs(self) -> list[TensorSpec]:
        from podium.backends.vllm import contract

        return contract.output_specs(self.task)

    @property
    def optional_inputs(self) -> frozenset[str]:
        """The optional tensors of Triton's vLLM contract (stream, sampling_parameters, …)."""
        from podium.backends.vllm import contract

        return contract.optional_inputs(self.task)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        from podium.backends.vllm import contract

        self._check_alive()
        with self.engine_errors():
            return await contract.infer(self.engine, request, task=self.task,
                                            sampling_params=self.sampling,
                                            caps=self.caps)

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        from podium.backends.vllm import contract

        self._check_alive()
        with self.engine_errors():
            async for response in contract.infer_stream(
                    self.engine, request, task=self.task, sampling_params=self.sampling,
                    caps=self.caps):
                yield response

    @property
    def caps(self) -> InstanceLimits:
        """What one request may ask of this model, on every protocol: the instance's limits
        with the package's `max_n` in place of `--max-n` when it sets one."""
        return self.limits.for_package(self.manifest.max_n)

    @contextlib.contextmanager
    def engine_errors(self) -> Iterator[None]:
        """vLLM's two engine errors in Podium's terms: EngineDeadError is fatal (BackendDead),
        EngineGenerateError fails this request only (BackendError); a request vLLM refuses
        (VLLMValidationError: scoring or embedding past the context, …) is a 400."""
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        from podium.backends.vllm.checks import engine_rejections

        try:
            with engine_rejections():
                yield
        except EngineDeadError as exc:
            raise BackendDead(f"the engine of {self.package.key} died: {exc}") from exc
        except EngineGenerateError as exc:
            raise BackendError(f"the engine of {self.package.key} failed this request: "
                               f"{exc}") from exc

    def sampling(self, **kwargs: Any) -> Any:
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
