"""The engine's allocator: the system's tcmalloc preloaded when installed, unless
``PODIUM_ENGINE_TCMALLOC=0``, and exported before vLLM's CPU platform reads ``LD_PRELOAD``."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.preload import environment


@pytest.fixture
def tcmalloc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    monkeypatch.setattr(environment, "SYSTEM_TCMALLOC", (str(lib),))
    monkeypatch.setattr(environment, "_package_libs",
                        lambda package, subdirs, pattern: "/torch.libs/libgomp.so.1"
                        if "gomp" in pattern else None)
    return str(lib)


def test_the_systems_tcmalloc_is_preloaded_by_default(tcmalloc: str) -> None:
    assert environment.engine_env({})["LD_PRELOAD"] == f"{tcmalloc}:/torch.libs/libgomp.so.1"


def test_podium_engine_tcmalloc_0_leaves_it_out(tcmalloc: str) -> None:
    env = environment.engine_env({"PODIUM_ENGINE_TCMALLOC": "0"})
    assert env["LD_PRELOAD"] == "/torch.libs/libgomp.so.1"


def test_an_operators_own_tcmalloc_is_kept(tcmalloc: str) -> None:
    env = environment.engine_env({"LD_PRELOAD": "/opt/libtcmalloc.so"})
    assert env["LD_PRELOAD"] == "/opt/libtcmalloc.so:/torch.libs/libgomp.so.1"


def test_it_is_exported_before_vllm_reads_it(tcmalloc: str) -> None:
    environ = {"PATH": "/bin"}
    assert environment.export_engine_preload(environ) == environ["LD_PRELOAD"]
    assert tcmalloc in environ["LD_PRELOAD"]
    # computed again from it (as the preloader's is), the same: vLLM's platform adds nothing
    assert environment.engine_env(environ)["LD_PRELOAD"] == environ["LD_PRELOAD"]
