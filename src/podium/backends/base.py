"""The Backend protocol: what the model repository and every frontend rely on.

Frontends know protocols, backends know models. A frontend turns its wire format into an
`InferenceRequest` of named numpy tensors and hands it to `Backend.infer` (or `infer_stream`
for decoupled models); LLM backends additionally expose `openai`, vLLM's own serving objects.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from podium.package.manifest import Manifest, TensorSpec

if TYPE_CHECKING:
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


class Backend(abc.ABC):
    """A loaded model version. One instance per (name, version) in the repository."""

    decoupled: bool = False
    """True when one request may produce several responses (streaming LLMs)."""

    def __init__(self, package: Package) -> None:
        self.package = package
        self.manifest: Manifest = package.manifest

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

    def is_alive(self) -> bool:
        """False once a part the backend cannot serve without (engine, batcher) has died."""
        return True

    @property
    def openai(self) -> Any | None:
        """vLLM serving state for OpenAI routes (chat, completions, embeddings), if any."""
        return None

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
