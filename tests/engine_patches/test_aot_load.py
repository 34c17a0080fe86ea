"""The AOT load fix on torch's own save/load of a stock-Inductor build (a tiny function compiled
on CPU, as vLLM compiles a model there), and on stand-ins for what a deserializer can return.
The real engine loading its build from Podium's compile cache is in
tests/package/test_compile_real.py."""

from __future__ import annotations

import io
from importlib import metadata
from pathlib import Path

import pytest
import torch

from podium.engine_patches import aot_load


def _double_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2


def _saved_build(path: Path) -> bytes:
    """`_double_sin` compiled AOT with stock Inductor, as vLLM's CPU mode does, then saved
    (as vLLM saves it: `save_compiled_function` to a file)."""
    compiled = torch.compile(_double_sin, fullgraph=True, backend="inductor")
    with torch._dynamo.config.patch(enable_aot_compile=True):
        aot = compiled.aot_compile(((torch.ones(4),), {}))
    aot.save_compiled_function(str(path))
    return path.read_bytes()


@pytest.fixture
def bundled(monkeypatch):
    """torch's wrapper class unpatched for the test, restored after it (the patch changes it
    in place; the plugin may already have patched it in this process: an engine test's
    vLLM loads its plugins in-process)."""
    cls = aot_load._bundled_callable()
    assert cls is not None, "torch no longer has BundledAOTAutogradSerializableCallable"
    original = cls.__dict__.get(aot_load.ORIGINAL, cls.__dict__["deserialize_compile_artifacts"])
    monkeypatch.setattr(cls, "deserialize_compile_artifacts", original)
    monkeypatch.setattr(cls, aot_load._MARK, False, raising=False)
    return cls


def test_a_loaded_stock_inductor_build_gets_the_step_vllm_calls_and_still_computes(
        bundled, tmp_path: Path) -> None:
    data = _saved_build(tmp_path / "model")
    x = torch.linspace(-3, 3, 4)

    # the bug, as vLLM meets it: the loaded function has no finalize_loading
    loaded = torch.compiler.load_compiled_function(io.BytesIO(data))
    assert not hasattr(loaded._artifacts.compiled_fn, aot_load.STEP)

    aot_load.patch(bundled)
    loaded = torch.compiler.load_compiled_function(io.BytesIO(data))
    step = loaded._artifacts.compiled_fn.finalize_loading
    assert step(object()) is None  # what vLLM's loader calls, with its config
    torch.testing.assert_close(loaded(x), _double_sin(x))


def test_only_a_function_without_the_step_gets_it() -> None:
    class Loader:
        returned: object = None

        @classmethod
        def deserialize_compile_artifacts(cls, data: bytes) -> object:
            return cls.returned

    def plain() -> None: ...

    class Finalizes:
        def finalize_loading(self, config: object) -> str:
            return "its own"

    aot_load.patch(Loader)
    wrapped = Loader.deserialize_compile_artifacts
    aot_load.patch(Loader)  # a second call wraps once
    assert Loader.deserialize_compile_artifacts == wrapped

    Loader.returned = plain
    assert Loader.deserialize_compile_artifacts(b"") is plain
    assert plain.finalize_loading(None) is None  # type: ignore[attr-defined]

    Loader.returned = own = Finalizes()
    assert Loader.deserialize_compile_artifacts(b"").finalize_loading(None) == "its own"
    assert Loader.deserialize_compile_artifacts(b"") is own

    Loader.returned = frozen = (1, 2)  # takes no attribute: returned as it is, vLLM recompiles
    assert Loader.deserialize_compile_artifacts(b"") is frozen


def test_the_pinned_cpu_engine_gets_the_fix_through_its_plugin_entry_point(bundled) -> None:
    """Also what the server asks before it compiles a CPU package with vLLM's AOT build on
    (`engine_build._reloadable_on`): an install older than the plugin fails here; reinstall
    (`pip install -e .`) to register it."""
    plugins = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.general_plugins")}
    assert plugins.get(aot_load.ENTRY_POINT) == "podium.engine_patches.aot_load:register"
    assert aot_load.applies() and aot_load.fixes_installed_engine()
    aot_load.register()
    assert getattr(bundled, aot_load._MARK)
