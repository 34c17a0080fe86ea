"""What every step kind shares: its settings' common fields and the environment it runs in.

A step kind is one pydantic model (`kind: Literal[...]`, extra fields forbidden) with
`prepare(env)` (load time: import a function, open a source, check a model exists) and
`run(args, call)` (per request: `args` are its settings with every reference resolved).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from podium.backends.base import InferenceRequest, InferenceResponse
from podium.errors import PackageError
from podium.package.paths import named_path

COMMON_FIELDS = frozenset({"name", "kind", "timeout_ms", "fallback", "default", "after",
                           "when_variant", "experiment"})


class ModelHost(Protocol):
    """The instance's repository, as a step sees it."""

    async def infer(self, name: str, version: str | None, request: InferenceRequest
                    ) -> InferenceResponse: ...

    def has_model(self, name: str, version: str | None = None) -> bool: ...


@dataclass
class StepEnv:
    """What steps are prepared against: the package and how models are reached."""

    root: Path
    """The pipeline package's directory (functions and relative SQLite files live there)."""
    models: ModelHost | None = None
    """This instance's models (called in-process); None outside an instance."""
    gateway_url: str | None = None
    """Where models not served here are called (KServe v2 HTTP)."""
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)


@dataclass
class CallContext:
    """One request as a step sees it."""

    request_id: str
    traceparent: str | None = None
    """The W3C traceparent of this step's span: passed on to models called over the network."""
    timeout_s: float | None = None
    """What is left of this step's time (its own timeout within the request deadline)."""


class StepSpec(BaseModel):
    """The fields every step has."""

    model_config = ConfigDict(extra="forbid", frozen=False, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$",
                      description="The step's name; references read its result as `$name`.")
    kind: str
    timeout_ms: int | None = Field(default=None, ge=1, le=600_000,
                                   description="This step's time; None: the request deadline.")
    fallback: Literal["fail", "skip", "default"] = Field(
        default="fail", description="On error or timeout: fail the request, skip (result "
        "null), or answer `default`.")
    default: Any = Field(default=None, description="The result when fallback is `default`.")
    after: list[str] = Field(default_factory=list, description="Steps to wait for besides "
                             "those referenced.")
    when_variant: list[str] | None = Field(
        default=None, description="Run only for these variants of the experiment step; "
        "otherwise the result is null.")
    experiment: str | None = Field(default=None, description="The experiment step "
                                   "`when_variant` refers to; needed only when there are "
                                   "several.")

    def settings(self) -> dict[str, Any]:
        """The kind's own settings (where references are resolved per request)."""
        return {k: getattr(self, k) for k in type(self).model_fields if k not in COMMON_FIELDS}

    def models(self) -> list[str]:
        """The models (`name` or `name@version`) this step calls, checked at load."""
        return []

    def prepare(self, env: StepEnv) -> None:
        """Load-time work; raise PackageError naming what is wrong."""
        return None

    async def run(self, args: dict[str, Any], call: CallContext) -> Any:
        raise NotImplementedError


def split_model(text: str) -> tuple[str, str | None]:
    """`name@version` → (name, version); `name` → (name, None)."""
    name, _, version = text.partition("@")
    return name, version or None


def load_function(root: Path, spec: str, functions: dict[str, Callable[..., Any]]
                  ) -> Callable[..., Any]:
    """`file.py:function` inside the package, imported once per package and file."""
    if spec in functions:
        return functions[spec]
    file, sep, name = spec.partition(":")
    if not sep or not name.isidentifier() or not file.endswith(".py"):
        raise PackageError(f"function {spec!r}: write it as `file.py:function_name`")
    path = named_path(root, file, "function")
    module_name = f"podium_pipelines.{abs(hash(str(path)))}.{Path(file).stem}"
    module = sys.modules.get(module_name)
    if module is None:
        loader = importlib.util.spec_from_file_location(module_name, path)
        if loader is None or loader.loader is None:
            raise PackageError(f"{path}: not a loadable Python file")
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        try:
            loader.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise PackageError(f"{path}: importing it failed: {type(exc).__name__}: {exc}"
                               ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise PackageError(f"{path}: defines no function {name!r}")
    functions[spec] = function
    return function
