"""The OpenAI API as a backend capability: what the OpenAI frontend calls (`Backend.openai`).

The frontend reads the body, finds the model, then calls the model's `OpenAIService` in two
steps and renders what it answers: `admit` (every check before the engine: fields, types,
caps, the seed, a `constraint` admitted and compiled) and `run` (the engine's answer, a JSON
body or a stream whose first event has been read). Each route is declared once here
(`ROUTES`); a new OpenAI endpoint is one more `OpenAIRoute` and one more case in the service.
Nothing here imports vLLM.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from podium.errors import PodiumError


@dataclass(frozen=True)
class OpenAIRoute:
    """One OpenAI endpoint and what a model must do to serve it."""

    name: str
    path: str
    task: str
    """`generate`, `embed` or `any`: the models that serve it."""
    model_optional: bool = False
    """True where vLLM's request model makes `model` optional and Podium follows: without
    it the request goes to the one model served (a 400 naming `model` when there are more)."""


CHAT = OpenAIRoute("chat_completions", "/v1/chat/completions", "generate")
CHAT_BATCH = OpenAIRoute("chat_completions_batch", "/v1/chat/completions/batch", "generate")
"""vLLM's batched chat: `messages` is a list of conversations, one choice each (no stream)."""
COMPLETIONS = OpenAIRoute("completions", "/v1/completions", "generate")
EMBEDDINGS = OpenAIRoute("embeddings", "/v1/embeddings", "embed")
TOKENIZE = OpenAIRoute("tokenize", "/tokenize", "any", model_optional=True)
DETOKENIZE = OpenAIRoute("detokenize", "/detokenize", "any", model_optional=True)
ROUTES = (CHAT, CHAT_BATCH, COMPLETIONS, EMBEDDINGS, TOKENIZE, DETOKENIZE)
INVOCATIONS = OpenAIRoute("invocations", "/invocations", "any", model_optional=True)
"""vLLM's SageMaker-style route: the body's shape picks CHAT, COMPLETIONS or EMBEDDINGS."""


@dataclass
class Usage:
    """Token counts of one answer (the request log's, whether the client asked or not)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass
class OpenAICall:
    """A request `admit` accepted, ready to `run`."""

    route: OpenAIRoute
    request: Any
    """The validated request (the service's own type)."""
    compile_seconds: float | None = None
    """Seconds its constraint took to compile at admission; None without a constraint."""


@dataclass
class OpenAIAnswer:
    """What the engine answered: a JSON body with its status, or a stream of SSE events."""

    status: int = 200
    body: dict[str, Any] | None = None
    stream: AsyncIterator[str] | None = None
    """SSE events, the first already read (an error there is a `body` with its status)."""
    usage: Usage | None = None
    """Token counts; for a stream, set once the stream has ended."""
    compile_seconds: float | None = None
    rendered: Any = None
    """An HTTP response the engine's serving layer rendered itself (vLLM's embeddings answer
    a starlette `Response`), passed through as it is."""


class OpenAIService(abc.ABC):
    """One model's OpenAI API."""

    @abc.abstractmethod
    def serves(self, route: OpenAIRoute) -> bool:
        """True when this model answers `route`."""

    def refusal(self, route: OpenAIRoute) -> PodiumError | None:
        """The refusal any request on `route` would get now, before its body is read (a full
        engine's 429), or None; the instance answers it from the request's head
        (`server.early_shed`)."""
        return None

    @abc.abstractmethod
    async def admit(self, route: OpenAIRoute, body: dict[str, Any]) -> OpenAICall:
        """Every check before the engine; a PodiumError (400, ...) names what is wrong."""

    @abc.abstractmethod
    async def run(self, call: OpenAICall, raw_request: Any) -> OpenAIAnswer:
        """The engine's answer. `raw_request`: the HTTP request (its headers and state), as
        the engine's serving layer reads it. Overloaded (429) and BackendDead (503) are
        raised; an answer the engine refused is a body with its status."""
