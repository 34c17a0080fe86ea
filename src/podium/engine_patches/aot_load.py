"""vLLM's AOT-compiled model loaded back from its cache on CPU, instead of traced again.

The bug: on CPU vLLM 0.32 compiles with `CompilationMode.DYNAMO_TRACE_ONCE` and torch's stock
`"inductor"` backend (`CpuPlatform.check_and_update_config`), not its own `VllmBackend`. With
AOT compile on (vLLM's default under torch >= 2.10), torch wraps what stock Inductor returns in
`BundledAOTAutogradSerializableCallable` and saves it; loading it back
(`torch.compiler.load_compiled_function`) gives the compiled code as a plain function, already
whole. vLLM's loader (`vllm.compilation.decorators._try_load_aot_compiled_fn`) then calls
`loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)`, a step only its own
`VllmSerializableFunction` has (it rebuilds the piecewise backend from the saved graph), so
every boot logs "Compiling model again due to a load failure ... 'function' object has no
attribute 'finalize_loading'" and Dynamo traces and Inductor compiles the model again.

The fix gives the function that stock Inductor's deserializer returns the step vLLM asks for,
as a no-op: there is nothing left to finalize (`VllmSerializableFunction.finalize_loading` is
itself a no-op once loaded). The loaded artifact then serves, and the boot skips Dynamo.
Only the pinned engine on CPU is patched, and only a function without the attribute gets it.

Installed as a vLLM general plugin (`vllm.general_plugins` entry point), run in every engine
process before the model is built. The server compiles a CPU package with vLLM's AOT build on
only where this plugin is installed for the pinned engine (`fixes_installed_engine`), else with
AOT off (Dynamo traces at each boot, Inductor's caches serve the code), never into a build it
would compile again at every boot.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("podium.engine_patches")
_MARK = "_podium_aot_load"
ORIGINAL = "_podium_unpatched_deserialize"
"""Where `patch` keeps the loader it wrapped (the raw descriptor), so a test can undo it."""
STEP = "finalize_loading"
ENTRY_POINT = "podium_aot_load"


def fixes_installed_engine() -> bool:
    """Whether the engine processes will run this fix: the pinned engine is installed and the
    plugin is registered (an install made before the plugin existed lacks it). Cheap: reads
    package metadata only, imports neither vLLM nor torch."""
    from importlib import metadata

    from podium.engine import ENGINE_VERSION, installed_engine

    found = installed_engine()
    if found is None or found[1].split("+")[0] != ENGINE_VERSION:
        return False
    return any(ep.name == ENTRY_POINT and ep.value == f"{__name__}:register"
               for ep in metadata.entry_points(group="vllm.general_plugins"))


def register() -> None:
    """The `vllm.general_plugins` entry point: patch stock Inductor's loader where it applies."""
    if applies():
        patch(_bundled_callable())


def applies() -> bool:
    """Whether this engine gets the fix: the pinned vLLM, on CPU, with torch's AOT loader."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception:
        return False
    from podium.engine import ENGINE_VERSION

    return (vllm.__version__.split("+")[0] == ENGINE_VERSION and current_platform.is_cpu()
            and _bundled_callable() is not None)


def _bundled_callable() -> Any:
    """torch's wrapper of a stock backend's compiled function for AOT save/load, or None."""
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable
    except ImportError:
        return None
    if not hasattr(BundledAOTAutogradSerializableCallable, "deserialize_compile_artifacts"):
        return None
    return BundledAOTAutogradSerializableCallable


def patch(cls: Any) -> None:
    """Wrap `cls.deserialize_compile_artifacts` so what it returns can be finalized; a second
    call does nothing."""
    if cls is None or getattr(cls, _MARK, False):
        return
    load = cls.deserialize_compile_artifacts  # bound to cls (a classmethod)
    setattr(cls, ORIGINAL, inspect.getattr_static(cls, "deserialize_compile_artifacts"))
    cls.deserialize_compile_artifacts = classmethod(_finalizable(load))
    setattr(cls, _MARK, True)
    log.debug("patched %s so vLLM can load its AOT build on CPU", cls.__name__)


def _finalizable(load: Callable[[bytes], Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def wrapper(cls: Any, data: bytes) -> Any:
        fn = load(data)
        if not hasattr(fn, STEP):
            try:
                setattr(fn, STEP, _already_loaded)
            except (AttributeError, TypeError):  # not a plain function: vLLM compiles again
                log.debug("cannot mark %r as loaded", type(fn).__name__)
        return fn

    return wrapper


def _already_loaded(vllm_config: Any) -> None:
    """Stock Inductor's function is whole once deserialized: nothing to finalize."""
