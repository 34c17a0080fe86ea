"""The compile cache on the real engine: a package that runs compiled on this machine is
compiled once at announce, boots without compiling, and a changed engine arg compiles again.

Two engine starts of the embedding model (all-MiniLM-L6-v2: 6 layers, the cheapest model
to compile here) at a small context: announce, then boot. The changed package's miss is
checked without a start of its own (its key and the reason it misses, as announce and boot
compute them; that a miss compiles is the first announce). The compile cache lives in a
temporary directory so every run starts cold.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import httpx
import pytest

from podium.package.defaults import EMBEDDING_MODEL, embedding_manifest
from podium.package.package import write_manifest
from tests.support.harness import PODIUM, ROOT, running_instance

if TYPE_CHECKING:
    from podium.backends.vllm.compile_cache import CompileJob

# what vLLM 0.32 logs once its engine is built; the warmup is where it compiles
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
# what Podium logs when the engine wrote compiled code although the entry matched
RECOMPILED = "although Podium's compile cache matched"


def _package(root: Path, max_model_len: int) -> Path:
    manifest = embedding_manifest()
    manifest.update(version=f"compiled-{max_model_len}", engine_mode="compiled",
                    engine_args={"max_model_len": max_model_len})
    return write_manifest(root / f"embedder-{max_model_len}", manifest).root


def _materialize(package: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*PODIUM, "materialize", str(package)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=900)


def _job(root: Path, max_model_len: int) -> CompileJob:
    """The package's compile job as announce and boot compute it (in this process, its
    environment left as it was), after materializing its weights as announce does."""
    from podium.backends.vllm import engine_build
    from podium.package.cache import ModelCache
    from podium.package.package import open_package

    package = open_package(_package(root, max_model_len))
    # the weights object is the one the first announce cached; this only writes the package's
    # ref to it (a fresh clone has never announced the changed package)
    weights = ModelCache().materialize(package).path
    with mock.patch.dict(os.environ):  # job_for sets the engine's environment
        return engine_build.job_for(package, weights, engine_build.resolve_mode(package))


@pytest.fixture
def compile_env(tmp_path: Path, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("PODIUM_COMPILE_CACHE", str(tmp_path / "compiled"))
    return {**os.environ}


@pytest.mark.engine
@pytest.mark.timeout(1200)  # two engine starts, one of them compiling
def test_compiled_once_at_announce_then_boots_without_compiling(
        tmp_path: Path, compile_env: dict[str, str]) -> None:
    from podium.backends.vllm.compile_cache import CompileCache

    started = time.monotonic()
    first = _materialize(_package(tmp_path, 128), compile_env)
    compile_s = time.monotonic() - started
    assert first.returncode == 0, first.stderr[-3000:]
    assert "compiled artifacts built" in first.stdout, first.stdout
    [job_log] = (tmp_path / "compiled").glob("*/compile.log")
    [entry] = (tmp_path / "compiled").glob("*/podium-compiled.json")
    files = json.loads(entry.read_text())["files"]
    # on CPU the build is Inductor's FX-graph and AOTAutograd cache (vLLM's AOT build is off)
    assert any(f.startswith("torchinductor/fxgraph/") for f in files), sorted(files)
    assert not any(f.startswith("torch_compile_cache/torch_aot_compile/") for f in files)
    [compiling_init] = map(float, INIT.findall(job_log.read_text()))

    started = time.monotonic()
    with running_instance([str(_package(tmp_path, 128))], tmp_path / "boot.log") as instance:
        boot_s = time.monotonic() - started
        reply = httpx.post(f"{instance.openai_url}/embeddings", timeout=120,
                           json={"model": EMBEDDING_MODEL, "input": "compiled once"})
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["data"][0]["embedding"]) == 384
        log = instance.log()
    assert f"engine mode of {EMBEDDING_MODEL}@compiled-128 on cpu: compiled" in log
    assert f"compile cache hit for {EMBEDDING_MODEL}@compiled-128" in log
    assert RECOMPILED not in log, log[-4000:]
    # the hit counter counts a boot only when the engine wrote no compiled code (no new or
    # rewritten FX-graph / AOTAutograd entry)
    assert json.loads(entry.read_text())["hits"] == 1
    [loading_init] = map(float, INIT.findall(log))
    print(f"\ncompile at announce {compile_s:.0f} s (engine init {compiling_init:.0f} s); "
          f"boot from the cache {boot_s:.0f} s (engine init {loading_init:.0f} s)")

    # the changed package misses the build, saying why, without an engine start of its own:
    # its key computed here is the one announce and boot compute (the unchanged package's
    # key, computed the same way, is the entry's), and a miss compiles (tests/backends/vllm/
    # test_compile_cache.py, on a fake engine; the first announce above, on the real one)
    assert _job(tmp_path, 128).key == entry.parent.name
    changed = _job(tmp_path, 256)
    assert changed.key != entry.parent.name
    cache = CompileCache(tmp_path / "compiled")
    assert cache.lookup(changed.key) is None
    why = cache.why_missing(changed.factors, changed.package_key)
    assert why == "the cached build differs in engine args: max_model_len 128 → 256", why

    for max_model_len, current in ((128, True), (256, False)):
        shown = subprocess.run([*PODIUM, "inspect", "--json",
                                str(_package(tmp_path, max_model_len))],
                               capture_output=True, text=True, env=compile_env, cwd=ROOT,
                               timeout=300)
        assert shown.returncode == 0, shown.stderr[-3000:]
        cached = json.loads(shown.stdout)["cached"]
        assert cached["engine_mode"] == "compiled"
        assert cached["compiled_cached"] is current, cached
        assert cached["compiled_key"] == _job(tmp_path, max_model_len).key
        # same weights: the 128 build is listed for both, current only for its own package
        [build] = cached["compiled"]
        assert build["engine_args"]["max_model_len"] == 128 and build["hits"] == 1
        assert build["current"] is current


def test_default_package_runs_eager_on_cpu_by_the_table(instance) -> None:
    """The shared instance (no extra boot) resolved the default package's `auto` to eager."""
    log = instance.log()
    assert "engine mode of smollm2-135m-instruct@1 on cpu: eager (auto on cpu:" in log
    assert "compile cache hit" not in log and "compile cache miss" not in log  # eager
