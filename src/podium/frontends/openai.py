"""The OpenAI-compatible API: /v1/models, /v1/chat/completions, /v1/completions,
/v1/embeddings, routed to each model's vLLM serving objects.

The request path, top to bottom: read a JSON object within the body limits (`json_body`) →
find the model (404) → reject fields Podium does not honour (400; the list is
`openai_fields.HONOURED`) → check each field's JSON type strictly (`openai_types`) and its
limits (`openai_limits`) → admit a `constraint` → validate with vLLM's own request model →
vLLM's serving class (cancelled if the client leaves) → JSON or SSE.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from podium.errors import BackendDead, InvalidArgument, NotFound, PodiumError
from podium.frontends.disconnect import cancel_on_disconnect
from podium.frontends.json_body import read_json_object
from podium.frontends.openai_fields import check_fields
from podium.frontends.openai_limits import OpenAILimits, check_limits
from podium.frontends.openai_structured import check_structured_output, structured_field
from podium.frontends.openai_types import check_types
from podium.metrics import request_log
from podium.metrics.server import track_in_flight
from podium.package.manifest import VllmManifest
from podium.repository import ModelEntry, ModelRepository
from podium.validation import describe, first_field

COMPILE_HEADER = "x-podium-constraint-compile-seconds"
"""Response header: seconds this request's constraint took to compile at admission."""


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI route and the vLLM serving object behind it."""

    path: str
    task: str
    serving_attr: str
    method: str | None  # None: the serving object is itself callable


CHAT = Endpoint("/v1/chat/completions", "generate", "openai_serving_chat",
                "create_chat_completion")
COMPLETIONS = Endpoint("/v1/completions", "generate", "openai_serving_completion",
                       "create_completion")
EMBEDDINGS = Endpoint("/v1/embeddings", "embed", "serving_embedding", None)


def create_router(repository: ModelRepository, *, limits: OpenAILimits) -> APIRouter:
    """The /v1 routes over every LLM and embedding model in `repository`."""
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(e) for e in
                                           repository.ready_entries() if e.backend.openai]}

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        name, version = split_model_id(model_id)
        entry = repository.find(name, version)
        if entry.backend.openai is None:
            raise NotFound(f"model {model_id!r} is not served over the OpenAI API",
                           param="model")
        return _model_card(entry)

    for endpoint in (CHAT, COMPLETIONS, EMBEDDINGS):
        router.add_api_route(endpoint.path, _handler(repository, endpoint, limits),
                             methods=["POST"], name=endpoint.serving_attr)
    return router


def _handler(repository: ModelRepository, endpoint: Endpoint, limits: OpenAILimits):
    async def handle(request: Request) -> Response:
        request_log.annotate(protocol="openai", endpoint=endpoint.path)
        body = await read_json_object(request, limits.body)
        model_id = body.get("model")
        if not isinstance(model_id, str) or not model_id:
            raise InvalidArgument("field 'model' is required and must be a string naming a "
                                  "served model (see GET /v1/models)", param="model")
        name, version = split_model_id(model_id)
        stack = AsyncExitStack()
        entry = await stack.enter_async_context(repository.lease(name, version))
        backend = entry.backend
        try:
            serving = _serving(backend, endpoint, model_id)
            body["model"] = name
            backend.check_seed(body.get("seed"))
            _parse(endpoint, body, limits, backend)
            compile_seconds = await _precompile(body, backend)
            hidden_usage = _ask_for_usage(endpoint, body)
            request_model = _validate(endpoint, body)
            stack.enter_context(track_in_flight("openai", endpoint.path, name, entry.version))
            # a client that leaves before the answer (or a stream's start) aborts the
            # generation: vLLM's serving objects do not watch the connection themselves
            result = await cancel_on_disconnect(
                request, _call_and_peek(serving, endpoint, request_model, request))
            _name_the_field(result, body)
            if _engine_died(result, backend):
                raise BackendDead(f"the engine of {entry.key} died while serving this request; "
                                  "the instance restarts, retry it")
        except BaseException:
            await stack.aclose()
            raise
        response = await _respond(result, stack, hidden_usage, compile_seconds)
        if compile_seconds is not None:
            response.headers[COMPILE_HEADER] = f"{compile_seconds:.6f}"
        return response

    handle.__name__ = f"openai_{endpoint.serving_attr}"
    return handle


def split_model_id(model_id: str) -> tuple[str, str | None]:
    """`name@version` addresses one version; a bare name means the latest ready one."""
    name, _, version = model_id.partition("@")
    return name, version or None


def _serving(backend: Any, endpoint: Endpoint, model_id: str) -> Any:
    """The vLLM serving object behind `endpoint` for this model, or a 400 saying where to go."""
    state = backend.openai
    serving = getattr(state, endpoint.serving_attr, None) if state is not None else None
    if serving is not None:
        return serving
    if state is None and backend.manifest.frontends == "standalone":
        kind, hint = ("packaged standalone (\"frontends\": \"standalone\"): KServe v2 only",
                      f"use /v2/models/{backend.name}/generate or /infer")
    elif state is None:
        kind, hint = "not an LLM", f"use /v2/models/{backend.name}/infer"
    elif endpoint.task == "generate":
        kind, hint = "an embedding model", "use /v1/embeddings"
    else:
        kind, hint = "a generative model", "use /v1/chat/completions or /v1/completions"
    raise InvalidArgument(f"model {model_id!r} does not support {endpoint.path}: it is {kind}; "
                          f"{hint}", param="model")


def _parse(endpoint: Endpoint, body: dict[str, Any], limits: OpenAILimits,
           backend: Any) -> None:
    """Refuse fields Podium does not honour, wrong types and values past a limit, then admit
    the constraint."""
    check_fields(endpoint.path, body)
    check_types(_request_model(endpoint, body), body)
    manifest = backend.package.manifest
    check_limits(endpoint.path, body, limits,
                 max_n=manifest.max_n if isinstance(manifest, VllmManifest) else None,
                 max_model_len=backend.max_model_len)
    if "constraint" in body:
        from podium.constraints import admit_constraint

        body["vllm_xargs"] = admit_constraint(body.pop("constraint"),
                                              min_tokens=body.get("min_tokens"),
                                              also_constrained_by=structured_field(body))
    check_structured_output(body, backend.max_model_len)


async def _precompile(body: dict[str, Any], backend: Any) -> float | None:
    """Compile the admitted constraint before the engine sees it (a thread pool, not the
    event loop); the seconds it took, or None without a constraint."""
    engine = backend.engine  # an LLM backend's vLLM engine (None in the test doubles)
    if "vllm_xargs" not in body or engine is None:
        return None
    from podium.constraints.precompile import precompile_xargs

    return await precompile_xargs(body["vllm_xargs"], engine.model_config)


def _validate(endpoint: Endpoint, body: dict[str, Any]) -> Any:
    """The body as vLLM's own request model (its validators run here)."""
    from vllm.exceptions import VLLMClientError

    model_cls = _request_model(endpoint, body)
    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        raise InvalidArgument(describe(exc), param=first_field(exc)) from None
    except VLLMClientError as exc:  # a model validator's verdict: pydantic does not wrap it
        message = str(exc.args[0]) if exc.args else type(exc).__name__
        raise InvalidArgument(message, param=getattr(exc, "parameter", None)) from None


async def _call(serving: Any, endpoint: Endpoint, request_model: Any, request: Request) -> Any:
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    try:
        if endpoint.method is None:
            return await serving(request_model, request)
        return await getattr(serving, endpoint.method)(request_model, request)
    except PodiumError:
        raise
    except Exception as exc:  # vLLM signals bad input by raising; it maps the class itself
        from vllm.exceptions import VLLMError

        from podium.backends.vllm_checks import admission_refusal

        if (refusal := admission_refusal(exc)) is not None:
            raise refusal from exc  # 429 + Retry-After, not vLLM's 503
        response = create_error_response(exc)
        if response.error.code >= 500 and not isinstance(exc, VLLMError):
            raise  # a bug, not vLLM's verdict: a 500 naming the request id, never its text
        return response


def _engine_died(result: Any, backend: Any) -> bool:
    """vLLM answers the requests its dead engine dropped with a plain 500: a 503 naming the
    dead engine tells the client it was not this request's fault."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    return (isinstance(result, ErrorResponse) and result.error.code >= 500
            and not backend.is_alive())


def _ask_for_usage(endpoint: Endpoint, body: dict[str, Any]) -> bool:
    """Streams report token counts only with stream_options.include_usage; ask vLLM for them
    always (the request log and metrics need them) and hide that chunk from a client that did
    not ask. True when the usage chunk must be hidden."""
    if endpoint is EMBEDDINGS or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage"):
        return False
    body["stream_options"] = {**options, "include_usage": True}
    return True


class _Stream:
    """A stream whose first chunk has been read (and was not an error)."""

    def __init__(self, first: str | None, rest: AsyncIterator[str]) -> None:
        self.first, self.rest = first, rest

    async def __aiter__(self) -> AsyncIterator[str]:
        if self.first is not None:
            yield self.first
        async for chunk in self.rest:
            yield chunk


async def _call_and_peek(serving: Any, endpoint: Endpoint, request_model: Any,
                         request: Request) -> Any:
    return await _first_chunk(await _call(serving, endpoint, request_model, request))


def _name_the_field(result: Any, body: dict[str, Any]) -> None:
    """vLLM names no field when its structured-outputs backend cannot build a grammar."""
    error = getattr(result, "error", None)
    if error is None or error.param is not None or "grammar" not in error.message.lower():
        return
    for field in ("response_format", "structured_outputs"):
        if field in body:
            error.param = field
            return


async def _first_chunk(result: Any) -> Any:
    """A stream's first chunk read before any byte is sent, so a request vLLM refuses inside
    its stream (a grammar its structured-outputs backend cannot build, an admission check
    past the frontend's) is answered with its own 4xx / 429 status, not a 200 whose first
    event is the error. Runs inside the disconnect watch: a client that leaves while the
    request waits for its first token still aborts it."""
    if not hasattr(result, "__aiter__"):
        return result
    stream = result.__aiter__()
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        return _Stream(None, stream)
    except BaseException:
        await stream.aclose()
        raise
    if (error := _stream_error(first)) is not None:
        await stream.aclose()
        return error
    return _Stream(first, stream)


def _stream_error(chunk: str) -> Any:
    """vLLM's `ErrorResponse` when an SSE chunk is its error event, else None."""
    if not chunk.startswith('data: {"error"'):
        return None
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    try:
        return ErrorResponse.model_validate_json(chunk.removeprefix("data: ").strip())
    except ValidationError:
        return None


async def _respond(result: Any, stack: AsyncExitStack, hidden_usage: bool = False,
                   compile_seconds: float | None = None) -> Response:
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    if isinstance(result, ErrorResponse):
        await stack.aclose()
        from podium.backends.vllm_checks import admission_response

        if (refusal := admission_response(result)) is not None:
            raise refusal  # refused inside vLLM's serving class, which answered it itself
        return JSONResponse(result.model_dump(), status_code=result.error.code)
    if isinstance(result, Response):
        await stack.aclose()
        return result
    if hasattr(result, "__aiter__"):
        # the lease lasts as long as the stream; a client that disconnects cancels the
        # generator, and vLLM aborts the request when its generator is closed
        return StreamingResponse(_leased(result, stack, hidden_usage),
                                 media_type="text/event-stream")
    await stack.aclose()
    _annotate_usage(getattr(result, "usage", None))
    data = result.model_dump(exclude_none=False)
    if compile_seconds is not None:
        data["constraint_compile_seconds"] = round(compile_seconds, 6)
    return JSONResponse(data)


async def _leased(stream: AsyncIterator[str], stack: AsyncExitStack,
                  hidden_usage: bool) -> AsyncIterator[str]:
    try:
        async for chunk in stream:
            if ('"usage":{' in chunk or '"usage": {' in chunk) and _annotate_usage_json(chunk) \
                    and hidden_usage:
                continue  # the usage-only chunk the client did not ask for
            yield chunk
    finally:
        await stack.aclose()


def _annotate_usage(usage: Any) -> None:
    if usage is not None:
        request_log.annotate(prompt_tokens=getattr(usage, "prompt_tokens", None),
                             completion_tokens=getattr(usage, "completion_tokens", None))


def _annotate_usage_json(chunk: str) -> bool:
    """Token counts from the SSE chunk that carries usage; True if it carries nothing else."""
    payload = chunk.removeprefix("data: ").strip()
    try:
        data = json.loads(payload)
    except ValueError:
        return False
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return False
    request_log.annotate(prompt_tokens=usage.get("prompt_tokens"),
                         completion_tokens=usage.get("completion_tokens"))
    return not data.get("choices")


def _request_model(endpoint: Endpoint, body: dict[str, Any]) -> type:
    if endpoint is CHAT:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest
    if endpoint is COMPLETIONS:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        return CompletionRequest
    from vllm.entrypoints.pooling.embed.protocol import (
        EmbeddingChatRequest,
        EmbeddingCompletionRequest,
    )

    return EmbeddingChatRequest if "messages" in body else EmbeddingCompletionRequest


def _model_card(entry: ModelEntry) -> dict[str, Any]:
    backend = entry.backend
    return {
        "id": entry.name,
        "object": "model",
        "created": int(entry.loaded_at),  # when this version became ready
        "owned_by": "podium",
        "root": entry.name,
        "version": entry.version,
        "max_model_len": backend.max_model_len,
        "task": backend.task,
    }
