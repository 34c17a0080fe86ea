"""The OpenAI-compatible API: /v1/models, /v1/chat/completions, /v1/completions,
/v1/embeddings, and as `vllm serve` has them /tokenize, /detokenize and /invocations (the
body's shape picks chat, completions or embeddings), each model's `OpenAIService`
(`Backend.openai`) behind them.

The request path, top to bottom: read a JSON object within the body limits (`json_body`) →
lease the model (404, 503) → the model's service, or a 400 saying which route to use →
`OpenAIService.admit` (every check before the engine: 400s) → `OpenAIService.run` (cancelled
if the client leaves) → render its answer as JSON or SSE; the lease ends with the response.
This module knows HTTP and the OpenAI wire format; what a model does with a request is its
backend's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from podium.backends import deadline
from podium.backends.openai_service import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    INVOCATIONS,
    ROUTES,
    OpenAIAnswer,
    OpenAIRoute,
    OpenAIService,
    Usage,
)
from podium.errors import DeadlineExceeded, InvalidArgument, NotFound
from podium.errors.render import encode, openai_body, problem_of
from podium.frontends.disconnect import cancel_on_disconnect
from podium.frontends.json_body import BodyLimits, read_json_object
from podium.metrics import request_log
from podium.metrics.server import track_in_flight
from podium.repository import ModelEntry, ModelRepository

COMPILE_HEADER = "x-podium-constraint-compile-seconds"
"""Response header: seconds this request's constraint took to compile at admission."""
COMPILE_FIELD = "constraint_compile_seconds"
"""The same figure as a field of a (non-streamed) answer."""


def create_router(repository: ModelRepository, *, limits: BodyLimits) -> APIRouter:
    """The /v1 routes over every model in `repository` that has an OpenAI service."""
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        entries = [e for e in repository.ready_entries() if e.backend.openai]
        return {"object": "list", "data": [_model_card(e) for e in entries]
                + [card for e in entries for card in _adapter_cards(e)]}

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        name, version = split_model_id(model_id)
        entry = repository.find(name, version)
        if entry.backend.openai is None:
            raise NotFound(f"model {model_id!r} is not served over the OpenAI API",
                           param="model")
        return _model_card(entry)

    for route in (*ROUTES, INVOCATIONS):
        router.add_api_route(route.path, _handler(repository, route, limits),
                             methods=["POST"], name=f"openai_{route.name}")
    return router


def _handler(repository: ModelRepository, route: OpenAIRoute, limits: BodyLimits):
    async def handle(request: Request) -> Response:
        request_log.annotate(protocol="openai", endpoint=route.path)
        with deadline.scope(deadline.from_headers(request.headers)):
            return await _handle(request)

    async def _handle(request: Request) -> Response:
        body = await read_json_object(request, limits)
        model_id = body.get("model")
        if model_id is None and route.model_optional:
            model_id = _only_model(repository)
        if not isinstance(model_id, str) or not model_id:
            raise InvalidArgument("field 'model' is required and must be a string naming a "
                                  "served model (see GET /v1/models)", param="model")
        name, version = split_model_id(model_id)
        stack = AsyncExitStack()
        entry = await stack.enter_async_context(repository.lease(name, version))
        try:
            target = _invoked(entry, body) if route is INVOCATIONS else route
            service = _service(entry, target, model_id)
            body["model"] = name
            call = await service.admit(target, body)
            if isinstance(body.get("user"), str):  # admitted: the request log's, per user
                request_log.annotate(user=body["user"])
            stack.enter_context(track_in_flight("openai", route.path, name, entry.version))
            # a client that leaves before the answer (or a stream's start) aborts the
            # generation: vLLM's serving objects do not watch the connection themselves
            # past its deadline (X-Request-Timeout) the generation is aborted: a 504
            answer = await cancel_on_disconnect(request, deadline.within(service.run(call,
                                                                                  request)))
        except BaseException:
            await stack.aclose()
            raise
        return await _render(answer, stack)

    handle.__name__ = f"openai_{route.name}"
    return handle


def _only_model(repository: ModelRepository) -> str:
    """The name of the one model served over the OpenAI API, or a 400 naming `model`."""
    names = sorted({e.name for e in repository.ready_entries() if e.backend.openai})
    if len(names) == 1:
        return names[0]
    served = f"this instance serves {', '.join(names)}" if names else \
        "this instance serves no model over the OpenAI API"
    raise InvalidArgument(f"field 'model' is required here: {served}; name one (see GET "
                          "/v1/models)", param="model")


_INVOCATION_SHAPES = (("messages", CHAT), ("prompt", COMPLETIONS), ("input", EMBEDDINGS),
                      ("messages", EMBEDDINGS))
"""/invocations: the first route whose key the body holds and the model serves (chat before
completions before embeddings, as `vllm serve` tries them)."""


def _invoked(entry: ModelEntry, body: dict[str, Any]) -> OpenAIRoute:
    service = entry.backend.openai
    for key, route in _INVOCATION_SHAPES:
        if key in body and (service is None or service.serves(route)):
            return route
    keys = [key for key, route in _INVOCATION_SHAPES if service is None or service.serves(route)]
    raise InvalidArgument(f"POST /invocations found no endpoint for this body: model "
                          f"{entry.name!r} takes a body with {' or '.join(dict.fromkeys(keys))}"
                          " (a chat completion, a completion or an embedding request)")


def split_model_id(model_id: str) -> tuple[str, str | None]:
    """`name@version` addresses one version; a bare name means the latest ready one. An `@`
    with nothing on one side is a 400 (`name@` was served as the latest version, as if the
    caller had not asked for one)."""
    name, at, version = model_id.partition("@")
    if at and (not name or not version):
        raise InvalidArgument(f"model={model_id!r}: use name@version (e.g. "
                              f"{name or 'my-model'}@1), or the bare name for the latest "
                              "ready version", param="model")
    return name, version or None


def _service(entry: ModelEntry, route: OpenAIRoute, model_id: str) -> OpenAIService:
    """The model's OpenAI service when it serves `route`, or a 400 saying where to go."""
    backend = entry.backend
    service = backend.openai
    if service is not None and service.serves(route):
        return service
    if service is None and backend.manifest.frontends == "standalone":
        kind, hint = ("packaged standalone (\"frontends\": \"standalone\"): KServe v2 only",
                      f"use /v2/models/{backend.name}/generate or /infer")
    elif service is None:
        kind, hint = "not an LLM", f"use /v2/models/{backend.name}/infer"
    elif route.task == "generate":
        kind, hint = "an embedding model", "use /v1/embeddings"
    else:
        kind, hint = "a generative model", "use /v1/chat/completions or /v1/completions"
    raise InvalidArgument(f"model {model_id!r} does not support {route.path}: it is {kind}; "
                          f"{hint}", param="model")


async def _render(answer: OpenAIAnswer | Response, stack: AsyncExitStack) -> Response:
    if isinstance(answer, Response):  # the client left: nobody reads this
        await stack.aclose()
        return answer
    if answer.rendered is not None:  # rendered by the engine's serving layer itself
        await stack.aclose()
        return answer.rendered
    if answer.stream is not None:
        # the lease lasts as long as the stream; a client that disconnects cancels the
        # generator, and vLLM aborts the request when its generator is closed
        response: Response = StreamingResponse(_leased(answer, stack, deadline.at()),
                                               media_type="text/event-stream")
    else:
        await stack.aclose()
        _annotate_usage(answer.usage)
        data = answer.body or {}
        if answer.compile_seconds is not None and answer.status == 200:
            data[COMPILE_FIELD] = round(answer.compile_seconds, 6)
        response = JSONResponse(data, status_code=answer.status)
    if answer.compile_seconds is not None:
        response.headers[COMPILE_HEADER] = f"{answer.compile_seconds:.6f}"
    return response


async def _leased(answer: OpenAIAnswer, stack: AsyncExitStack, until: float | None
                  ) -> AsyncIterator[str]:
    """The stream while its lease lasts; past the request's deadline (`until`) the generation
    is aborted and the stream ends with a 504 error event, as vLLM ends a failed stream."""
    assert answer.stream is not None
    try:
        async for chunk in deadline.until(answer.stream, until):
            yield chunk
        _annotate_usage(answer.usage)
    except DeadlineExceeded as exc:
        yield f"data: {encode(openai_body(problem_of(exc))).decode()}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await stack.aclose()


def _annotate_usage(usage: Usage | None) -> None:
    if usage is not None:
        request_log.annotate(prompt_tokens=usage.prompt_tokens,
                             completion_tokens=usage.completion_tokens)


def _model_card(entry: ModelEntry) -> dict[str, Any]:
    backend = entry.backend
    card = {
        "id": entry.name,
        "object": "model",
        "created": int(entry.loaded_at),  # when this version became ready
        "owned_by": "podium",
        "root": entry.name,
        "version": entry.version,
        "max_model_len": backend.max_model_len,
        "task": backend.task,
    }
    if backend.parent is not None:  # a LoRA adapter, served on its base's engine
        card.update(root=backend.parent, parent=backend.parent)
    return card


def _adapter_cards(entry: ModelEntry) -> list[dict[str, Any]]:
    """One card per LoRA adapter the model serves (its highest version; `parent` = the
    model, as `vllm serve` lists its adapters)."""
    versions: dict[str, list[str]] = {}
    for card in entry.backend.adapters():
        versions.setdefault(card.name, []).append(card.version)
    return [{"id": name, "object": "model", "created": int(entry.loaded_at),
             "owned_by": "podium", "root": entry.name, "parent": entry.name,
             "version": found[-1], "versions": found,
             "max_model_len": entry.backend.max_model_len, "task": entry.backend.task}
            for name, found in versions.items()]
