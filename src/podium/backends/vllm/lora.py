"""LoRA adapters on a vLLM model's engine: each adapter version served as a view of its base.

`Adapters` (one per LLM backend with `lora` on) finds an adapter on each request in the cache's
adapter index (`package.adapter_store`), so an adapter announced after boot is served with no
restart and no registration call. An `AdapterView` is a `Backend` whose name and version are
the adapter's and whose engine is the base's: KServe requests reach the engine with the
adapter's `LoRARequest` (`_AdapterEngine`), OpenAI requests through vLLM's own serving objects
with the adapter registered in vLLM's model table under `name@version`. The first request of a
version loads it into the engine (`add_lora`, vLLM's LRU beyond `max_cpu_loras`); a load that
fails fails that request alone, naming the adapter.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.backends.base import Backend, InferenceRequest, InferenceResponse
from podium.backends.limits import InstanceLimits
from podium.backends.openai_service import OpenAIAnswer, OpenAICall, OpenAIRoute, OpenAIService
from podium.errors import BackendDead, BackendError, PodiumError
from podium.package.adapter import check_files, check_fits_base
from podium.package.adapter_store import AdapterStore, StoredAdapter
from podium.package.manifest import LoraManifest, TensorSpec
from podium.package.package import Package

if TYPE_CHECKING:
    from podium.backends.vllm.backend import VllmBackend

log = logging.getLogger("podium.backends.vllm")


class Adapters:
    """The adapters of one base backend: found in the cache per request, one view each."""

    def __init__(self, base: VllmBackend, store: AdapterStore | None = None) -> None:
        self.base = base
        self.store = store or AdapterStore()
        self._views: dict[str, AdapterView] = {}
        self._ids = itertools.count(1)

    def find(self, name: str, version: str | None) -> AdapterView | None:
        """The view serving adapter name@version (its highest version without one)."""
        stored = self.store.find(self.base.package.key, name, version)
        if stored is None:
            return None
        view = self._views.get(stored.info.key)
        if view is None or view.stored.path != stored.path:
            view = AdapterView(self.base, stored, next(self._ids))
            self._views[stored.info.key] = view
        return view

    def listed(self) -> list[StoredAdapter]:
        """Every adapter of the base in the cache (for /v1/models)."""
        return self.store.list_for(self.base.package.key)


class AdapterView(Backend):
    """One adapter version served on its base's engine."""

    decoupled = True

    def __init__(self, base: VllmBackend, stored: StoredAdapter, lora_id: int) -> None:
        info = stored.info
        manifest = LoraManifest(name=info.name, version=info.version, backend="lora",
                                base=info.base_key, rank=info.rank)
        super().__init__(Package(stored.path, manifest))
        self.base, self.stored = base, stored
        self.limits = base.limits
        from vllm.lora.request import LoRARequest

        self.lora = LoRARequest(lora_name=info.key, lora_int_id=lora_id,
                                lora_path=str(stored.path))
        self.lora.base_model_name = base.name
        self._loaded = False
        self._loading = asyncio.Lock()
        self._openai: AdapterOpenAI | None = None

    # -- what it serves: the adapter's name, the base's everything else ---------------------
    @property
    def platform(self) -> str:
        return "vllm"

    @property
    def task(self) -> str:
        return self.base.task

    @property
    def max_model_len(self) -> int:
        return self.base.max_model_len

    @property
    def caps(self) -> InstanceLimits:
        return self.base.caps

    @property
    def engine(self) -> Any:
        return self.base.engine

    @property
    def parent(self) -> str:
        """The base model's name (OpenAI's `parent` of the adapter's model card)."""
        return self.base.name

    def inputs(self) -> list[TensorSpec]:
        return self.base.inputs()

    def outputs(self) -> list[TensorSpec]:
        return self.base.outputs()

    @property
    def optional_inputs(self) -> frozenset[str]:
        return self.base.optional_inputs

    def check_seed(self, seed: object) -> None:
        self.base.check_seed(seed)

    def is_alive(self) -> bool:
        return self.base.is_alive()

    def refusal(self) -> PodiumError | None:
        return self.base.refusal()  # the base's engine runs the adapter's requests

    async def load(self) -> None:  # the base's engine is loaded; the adapter loads on use
        return None

    async def unload(self) -> None:
        return None

    @property
    def openai(self) -> OpenAIService | None:
        base = self.base.openai
        if base is None:
            return None
        if self._openai is None:
            self._openai = AdapterOpenAI(self, base)
        return self._openai

    # -- the engine, with the adapter on ----------------------------------------------------
    async def ensure_loaded(self) -> None:
        """Check the adapter against the base and load it into the engine, once; a failure
        fails this request alone (and the next request tries again)."""
        if self._loaded:
            return
        async with self._loading:
            if self._loaded:
                return
            manifest = self.base.manifest
            try:
                files = await asyncio.to_thread(check_files, self.stored.path, self.manifest)
                check_fits_base(files, self.stored.info, manifest.lora,
                                Path(self.base.args.model))
            except PodiumError as exc:
                self._count_load("refused")
                raise type(exc)(f"adapter {self.stored.info.key} cannot be served by "
                                f"{self.base.package.key}: {exc.message}",
                                param="model") from None
            try:
                await self.base.engine.add_lora(self.lora)
            except Exception as exc:
                self._count_load("failed")
                if not self.base.is_alive():
                    raise BackendDead(f"the engine of {self.base.package.key} died loading "
                                      f"adapter {self.stored.info.key}") from exc
                raise BackendError(f"adapter {self.stored.info.key} failed to load: "
                                   f"{type(exc).__name__}: {exc}") from exc
            self._count_load("ok")
            self._loaded = True
            log.info("adapter %s loaded on %s", self.stored.info.key, self.base.package.key)

    def _count_load(self, outcome: str) -> None:
        from podium.metrics.server import observe_adapter_load

        info = self.stored.info
        observe_adapter_load(self.base.name, info.name, info.version, outcome)

    def count_tokens(self, usage: Any) -> None:
        """Add one answered OpenAI request's tokens to the adapter's counters."""
        if usage is not None:
            self._count_tokens(usage.prompt_tokens, usage.completion_tokens)

    def _count_tokens(self, prompt: int | None, completion: int | None) -> None:
        from podium.metrics.server import observe_adapter_tokens

        info = self.stored.info
        observe_adapter_tokens(self.base.name, info.name, info.version, prompt, completion)

    def _counting_engine(self) -> _AdapterEngine:
        """The engine for a KServe request of this adapter (its tokens counted here)."""
        return _AdapterEngine(self.engine, self.lora, self._count_tokens)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        from podium.backends.vllm import contract

        await self.ensure_loaded()
        with self.base.engine_errors():
            return await contract.infer(self._counting_engine(), request,
                                        task=self.task, sampling_params=self.base.sampling,
                                        caps=self.caps)

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        from podium.backends.vllm import contract

        await self.ensure_loaded()
        with self.base.engine_errors():
            async for response in contract.infer_stream(
                    self._counting_engine(), request, task=self.task,
                    sampling_params=self.base.sampling, caps=self.caps):
                yield response

    def config(self) -> dict[str, Any]:
        config = self.base.config()
        config.update(name=self.name, version_policy={"specific": {"versions": [self.version]}},
                      parameters={"lora_base": {"string_value": self.base.package.key},
                                  "lora_rank": {"string_value": str(self.stored.info.rank)}})
        return config


class AdapterOpenAI(OpenAIService):
    """The base's OpenAI service with the adapter on: vLLM's serving objects look the request's
    `model` up in their LoRA table, where the adapter is registered as `name@version`."""

    def __init__(self, view: AdapterView, base: OpenAIService) -> None:
        self.view, self.base = view, base

    def serves(self, route: OpenAIRoute) -> bool:
        return self.base.serves(route)

    async def admit(self, route: OpenAIRoute, body: dict[str, Any]) -> OpenAICall:
        body["model"] = self.view.lora.lora_name
        return await self.base.admit(route, body)

    async def run(self, call: OpenAICall, raw_request: Any) -> OpenAIAnswer:
        await self.view.ensure_loaded()
        state = getattr(self.base, "state", None)
        models = getattr(state, "openai_serving_models", None)
        if models is not None:
            models.lora_requests[self.view.lora.lora_name] = self.view.lora
        answer = await self.base.run(call, raw_request)
        stream = answer.stream
        if stream is None:
            self.view.count_tokens(answer.usage)
        elif hasattr(stream, "on_end"):  # a stream's usage is known once it has ended
            ended = stream.on_end

            def on_end() -> None:
                if ended is not None:
                    ended()
                self.view.count_tokens(answer.usage)

            stream.on_end = on_end
        return answer


class _AdapterEngine:
    """The base's engine with every generation carrying the adapter's `LoRARequest`, and each
    generation's tokens counted for the adapter (`count(prompt, completion)`) when it ends,
    finished or not: KServe's answers carry no usage, so the engine's outputs are read."""

    def __init__(self, engine: Any, lora: Any,
                 count: Callable[[int | None, int | None], None] | None = None) -> None:
        self._engine, self._lora, self._count = engine, lora, count

    def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any
                 ) -> AsyncIterator[Any]:
        outputs = self._engine.generate(prompt, sampling_params, request_id,
                                        lora_request=self._lora, **kwargs)
        if self._count is None:
            return outputs
        kind = getattr(getattr(sampling_params, "output_kind", None), "name", "")
        return _counted(outputs, self._count, delta=kind == "DELTA")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


async def _counted(outputs: AsyncIterator[Any], count: Callable[[int | None, int | None], None],
                   *, delta: bool) -> AsyncIterator[Any]:
    """`outputs` as they come; once they end (finished, failed or cancelled), `count` gets the
    prompt's tokens and the completions' tokens generated so far (summed over deltas)."""
    prompt: int | None = None
    completion = 0
    last: list[int] = []
    try:
        async for output in outputs:
            if prompt is None and getattr(output, "prompt_token_ids", None) is not None:
                prompt = len(output.prompt_token_ids)
            sizes = [len(getattr(c, "token_ids", ()) or ()) for c in output.outputs]
            if delta:
                completion += sum(sizes)
            else:
                last = sizes
            yield output
    finally:
        count(prompt, completion if delta else sum(last))
