"""`python`: a pre- or post-processing function from the package, called with resolved args."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from podium.pipelines.steps.base import CallContext, StepEnv, StepSpec, load_function


class PythonStep(StepSpec):
    """Result: whatever the function returns (a dict reads best downstream)."""

    kind: Literal["python"]
    function: str = Field(description="`file.py:function` inside the package; a plain "
                          "function runs in a worker thread (on the loop with `inline`), an "
                          "async one on the loop.")
    inline: bool = Field(default=False, description="Call a plain function on the event loop, "
                         "saving the hop to a worker thread: only for a function that takes "
                         "well under a millisecond and never blocks (it holds up every "
                         "request of the instance while it runs).")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments; "
                                 "references are resolved per request.")
    _function: Callable[..., Any] | None = PrivateAttr(default=None)

    def prepare(self, env: StepEnv) -> None:
        self._function = load_function(env.root, self.function, env.functions)

    async def run(self, args: dict[str, Any], call: CallContext) -> Any:
        return await call_function(self._function, args["args"], inline=self.inline)


async def call_function(function: Callable[..., Any] | None, kwargs: dict[str, Any], *,
                        inline: bool = False) -> Any:
    """Await an async function; run a plain one in a thread (it may block), or here when
    declared `inline` (cheap and non-blocking)."""
    assert function is not None, "prepare() runs before run()"
    if inspect.iscoroutinefunction(function):
        return await function(**kwargs)
    if inline:
        return function(**kwargs)
    return await asyncio.to_thread(function, **kwargs)
