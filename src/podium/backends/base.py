"""The Backend protocol: what the model repository and every frontend rely on.

Frontends know protocols, backends know models. A frontend turns its wire format into an
`InferenceRequest` of named numpy tensors and hands it to `Backend.infer` (or `infer_stream`
for decoupled models); LLM backends additionally expose `openai`, an `OpenAIService` (the
OpenAI routes call it the same way: frontend → repository lease → backend).

Every optional capability has a default here, and a backend overrides what it supports:
nothing above this layer probes a backend with getattr/hasattr. Errors: `BackendError` fails
one request (recoverable); `BackendDead` means the engine is gone and the instance must restart
(fatal); `is_alive()` turning false means the same.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from podium.backends.limits import InstanceLimits
from podium.package.manifest import Manifest, TensorSpec

if TYPE_CHECKING:
    from podium.backends.openai_service import OpenAIService
    from podium.errors import PodiumError
    from podium.package.package import Package


@dataclass
class Tensor:
    """A named tensor. BYTES tensors hold an object array of `bytes`."""

    name: str
    datatype: str
    data: np.ndarray

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape)


@dataclass
class InferenceRequest:
    """One scoring call, protocol-independent."""

    inputs: dict[str, Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    requested_outputs: list[str] | None = None
    """None means every output."""


@dataclass
class InferenceResponse:
    """The answer to one `InferenceRequest` (or one part of a decoupled stream)."""

    outputs: list[Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    final: bool = True
    """False on every part of a decoupled stream but the last."""
    model_version: str = ""
    """The version that served the request (set by the repository)."""
    admission_bound: int | None = None
    """The in-flight bound this instance measured for the model (classic backends,
    `classic_admission`); sent to the gateway as the `podium-admission-bound` header."""


@dataclass(frozen=True)
class AdapterCard:
    """A LoRA adapter version a model serves (listed under the model in /v1/models)."""

    name: str
    version: str
    rank: int


class ModelCaller(Protocol):
    """What a backend may call other models through (the repository; python ensembles)."""

    async def infer(self, name: str, version: str | None, request: InferenceRequest
                    ) -> InferenceResponse: ...

    def has_model(self, name: str, version: str | None = None) -> bool:
        """Whether name (@version) is packaged or served here (loaded or not yet)."""
        ...


class Backend(abc.ABC):
    """A loaded model version. One instance per (name, version) in the repository."""

    decoupled: bool = False
    """True when one request may produce several responses (streaming LLMs)."""

    def __init__(self, package: Package) -> None:
        self.package = package
        self.manifest: Manifest = package.manifest
        self.limits = InstanceLimits()
        """The instance's flags, set by the repository before `load`."""

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def platform(self) -> str:
        """Triton's `platform` string for model metadata."""
        return self.manifest.backend

    @abc.abstractmethod
    async def load(self) -> None:
        """Make the model ready to serve (heavy: weights, engine, warm-up)."""

    @abc.abstractmethod
    async def unload(self) -> None:
        """Release everything `load` acquired. In-flight requests have finished."""

    @abc.abstractmethod
    def inputs(self) -> list[TensorSpec]:
        """Input tensors, declared in the manifest or derived from the model at load."""

    @abc.abstractmethod
    def outputs(self) -> list[TensorSpec]:
        """Output tensors, declared in the manifest or derived from the model at load."""

    @property
    def max_batch_size(self) -> int:
        return int(getattr(self.manifest, "max_batch_size", 0))

    @abc.abstractmethod
    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Score one request. Raise podium.errors.RequestError subclasses for bad input."""

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Decoupled scoring; non-decoupled backends answer once."""
        yield await self.infer(request)

    @property
    def openai(self) -> OpenAIService | None:
        """The OpenAI API over this model (chat, completions, embeddings), if it has one."""
        return None

    # -- optional capabilities: the defaults of a backend that has none ----------------------
    @property
    def task(self) -> str | None:
        """What an LLM does (`generate`, `embed`); None for other models."""
        return None

    @property
    def max_model_len(self) -> int | None:
        """An LLM's context length in tokens; None for other models."""
        return None

    @property
    def optional_inputs(self) -> frozenset[str]:
        """Declared inputs a request may omit."""
        return frozenset()

    @property
    def execution_count(self) -> int | None:
        """Model calls made; None when every request is one call."""
        return None

    def batch_stats(self) -> list[dict[str, Any]]:
        """Triton-style per-batch-size statistics; empty without a dynamic batcher."""
        return []

    def check_seed(self, seed: object) -> None:
        """Raise InvalidArgument if a request's `seed` cannot be honoured."""
        return None  # by default every seed is honoured

    def refusal(self) -> PodiumError | None:
        """The refusal any inference request would get now, before it is read (a full
        engine's 429), or None; the instance answers it from the request's head
        (`server.early_shed`). Cheap: it runs for every request head."""
        return None

    def adapter(self, name: str, version: str | None) -> Backend | None:
        """A backend serving LoRA adapter name[@version] (its highest version without one) on
        this model's engine, or None: this model serves no such adapter."""
        return None

    def adapters(self) -> list[AdapterCard]:
        """The LoRA adapters this model serves now."""
        return []

    serves_adapters: bool = False
    """True when requests naming LoRA adapters of this model reach it (its engine has adapters
    enabled): its routes' model is then known only from a request's body. Cheap to read."""

    @property
    def parent(self) -> str | None:
        """The model an adapter runs on (OpenAI's `parent`); None for a model."""
        return None

    def bind_repository(self, repository: ModelCaller) -> None:
        """Called before `load` with the repository the model may call other models through."""
        return None  # only models that call others keep it

    def is_alive(self) -> bool:
        """False once a part the backend cannot serve without (engine, batcher) has died for
        good: the instance must restart."""
        return True

    def config(self) -> dict[str, Any]:
        """Triton-style model configuration, as served at /v2/models/{m}/config."""
        return {
            "name": self.name,
            "platform": self.platform,
            "backend": self.manifest.backend,
            "version_policy": {"specific": {"versions": [self.version]}},
            "max_batch_size": self.max_batch_size,
            "input": [_spec_config(s) for s in self.inputs()],
            "output": [_spec_config(s) for s in self.outputs()],
            "model_transaction_policy": {"decoupled": self.decoupled},
        }


def _spec_config(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "data_type": f"TYPE_{spec.datatype}".replace("BYTES", "STRING"),
            "dims": spec.shape}
