"""The vLLM backend's OpenAI API: vLLM's own serving objects (`OpenAIServingChat`,
`OpenAIServingCompletion`, the embeddings one, `ServingTokenization`) behind Podium's checks.

`admit`: the body validated as the strict subclass of vLLM's request model
(`openai_request`), the constraint compiled. `run`: vLLM's serving
call → a stream's first event read before anything is sent (an error there keeps its status)
→ vLLM's error answers in Podium's terms (admission control's 503 is a 429, a dead engine's
500 is a 503) → usage as vLLM counted it (`RequestResponseMetadata.final_usage_info`, which it
records on the HTTP request whether or not the client asked for usage).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from pydantic import ValidationError

from podium.backends.limits import InstanceLimits
from podium.backends.openai_service import (
    CHAT,
    CHAT_BATCH,
    COMPLETIONS,
    DETOKENIZE,
    EMBEDDINGS,
    TOKENIZE,
    OpenAIAnswer,
    OpenAICall,
    OpenAIRoute,
    OpenAIService,
    Usage,
)
from podium.backends.vllm import checks, constraint, openai_request
from podium.errors import BackendDead, InvalidArgument, PodiumError

_SERVING = {CHAT: ("openai_serving_chat", "create_chat_completion"),
            CHAT_BATCH: ("openai_serving_chat_batch", "create_batch_chat_completion"),
            COMPLETIONS: ("openai_serving_completion", "create_completion"),
            EMBEDDINGS: ("serving_embedding", None),  # None: the object itself is called
            TOKENIZE: ("serving_tokenization", "create_tokenize"),
            DETOKENIZE: ("serving_tokenization", "create_detokenize")}
"""Per route, vLLM's serving object (an attribute of its app state) and the method called."""


class Model(Protocol):
    """What the service needs of its backend (`VllmBackend`, or a test double)."""

    engine: Any
    """vLLM's AsyncLLM; None in test doubles (constraints are then not compiled here)."""

    @property
    def caps(self) -> InstanceLimits: ...

    @property
    def max_model_len(self) -> int | None: ...

    def check_seed(self, seed: object) -> None: ...

    def is_alive(self) -> bool: ...

    @property
    def package(self) -> Any: ...


class VllmOpenAI(OpenAIService):
    """One model's OpenAI routes over vLLM's serving objects (`state`: vLLM's app state)."""

    def __init__(self, model: Model, state: Any) -> None:
        self.model, self.state = model, state

    def serves(self, route: OpenAIRoute) -> bool:
        return self._serving(route) is not None

    def refusal(self, route: OpenAIRoute) -> PodiumError | None:
        if route not in _GENERATING:
            return None
        return checks.room_refusal(self.model.engine)

    async def admit(self, route: OpenAIRoute, body: dict[str, Any]) -> OpenAICall:
        model = self.model
        if route in _GENERATING:
            checks.check_room(model.engine, body.get("n"), model.caps.max_n)
        model.check_seed(body.get("seed"))
        request = openai_request.validate(route, body, model.caps, model.max_model_len)
        _check_priority(body.get("priority"), model)
        # the admitted constraint compiled before the engine sees it
        xargs = getattr(request, "vllm_xargs", None) if "constraint" in body else None
        compile_seconds = await constraint.precompile(xargs, model.engine)
        return OpenAICall(route, request, compile_seconds)

    async def run(self, call: OpenAICall, raw_request: Any) -> OpenAIAnswer:
        result = await _first_chunk(await self._call(call, raw_request))
        if isinstance(result, _Stream):
            answer = OpenAIAnswer(stream=result, compile_seconds=call.compile_seconds)
            result.on_end = lambda: _set_usage(answer, raw_request)
            return answer
        if _is_error(result):
            return self._error(result, call)
        if not hasattr(result, "model_dump"):  # a starlette Response (embeddings)
            return OpenAIAnswer(status=getattr(result, "status_code", 200), rendered=result,
                                compile_seconds=call.compile_seconds)
        usage = getattr(result, "usage", None)
        return OpenAIAnswer(body=result.model_dump(exclude_none=False),
                            usage=_usage(usage), compile_seconds=call.compile_seconds)

    def _serving(self, route: OpenAIRoute) -> Any:
        attr, _ = _SERVING[route]
        return getattr(self.state, attr, None) if self.state is not None else None

    async def _call(self, call: OpenAICall, raw_request: Any) -> Any:
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response,
        )

        serving = self._serving(call.route)
        method = _SERVING[call.route][1]
        try:
            if method is None:
                return await serving(call.request, raw_request)
            return await getattr(serving, method)(call.request, raw_request)
        except PodiumError:
            raise
        except Exception as exc:  # vLLM signals bad input by raising; it maps the class itself
            from vllm.exceptions import VLLMError

            from podium.backends.vllm.checks import admission_refusal

            if (refusal := admission_refusal(exc)) is not None:
                raise refusal from exc  # 429 + Retry-After, not vLLM's 503
            response = create_error_response(exc)
            if response.error.code >= 500 and not isinstance(exc, VLLMError):
                raise  # a bug, not vLLM's verdict: a 500 naming the request id, never its text
            return response

    def _error(self, response: Any, call: OpenAICall) -> OpenAIAnswer:
        """vLLM's error answer in Podium's terms."""
        from podium.backends.vllm.checks import admission_response

        if response.error.code >= 500 and not self.model.is_alive():
            # vLLM answers the requests its dead engine dropped with a plain 500
            raise BackendDead(f"the engine of {self.model.package.key} died while serving "
                              "this request; the instance restarts, retry it")
        if (refusal := admission_response(response)) is not None:
            raise refusal  # refused inside vLLM's serving class, which answered it itself
        _name_the_field(response, call.request)
        return OpenAIAnswer(status=response.error.code, body=response.model_dump(),
                            compile_seconds=call.compile_seconds)


_GENERATING = (CHAT, CHAT_BATCH, COMPLETIONS, EMBEDDINGS)
"""The routes that add engine requests (tokenize and detokenize add none)."""


def _check_priority(priority: Any, model: Model) -> None:
    """`priority` takes effect only under vLLM's priority scheduling (engine_args
    scheduling_policy: priority); under first come, first served a non-zero one is refused,
    as vLLM would silently ignore it."""
    if priority in (None, 0) or isinstance(priority, bool) or not isinstance(priority, int):
        return  # 0 is every request's priority; a wrong type is the request model's 400
    args = getattr(model, "args", None)
    if getattr(args, "scheduling_policy", "fcfs") == "priority":
        return
    raise InvalidArgument(
        f"priority={priority} has no effect: {model.package.key} schedules first come, first "
        "served; remove priority, or serve the package with engine_args scheduling_policy: "
        "priority (lower values are served first)", param="priority")


class _Stream:
    """A stream whose first event has been read (and was not an error); `on_end` runs once
    it has been read to its end."""

    def __init__(self, first: str | None, rest: AsyncIterator[str]) -> None:
        self.first, self.rest = first, rest
        self.on_end: Any = None

    async def __aiter__(self) -> AsyncIterator[str]:
        if self.first is not None:
            yield self.first
        async for chunk in self.rest:
            yield chunk
        if self.on_end is not None:
            self.on_end()


async def _first_chunk(result: Any) -> Any:
    """A stream's first chunk read before any byte is sent, so a request vLLM refuses inside
    its stream (a grammar its structured-outputs backend cannot build, an admission check)
    is answered with its own 4xx / 429 status, not a 200 whose first event is the error.
    Runs inside the frontend's disconnect watch: a client that leaves while the request waits
    for its first token still aborts it."""
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


def _is_error(result: Any) -> bool:
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    return isinstance(result, ErrorResponse)


def _name_the_field(response: Any, request: Any) -> None:
    """vLLM names no field when its structured-outputs backend cannot build a grammar."""
    error = response.error
    if error.param is not None or "grammar" not in error.message.lower():
        return
    for field in ("response_format", "structured_outputs"):
        if field in getattr(request, "model_fields_set", ()):
            error.param = field
            return


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    return Usage(getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None))


def _set_usage(answer: OpenAIAnswer, raw_request: Any) -> None:
    """A stream's token counts, as vLLM recorded them on the request when the stream ended."""
    state = getattr(raw_request, "state", None)
    metadata = getattr(state, "request_metadata", None) if state is not None else None
    answer.usage = _usage(getattr(metadata, "final_usage_info", None))
