"""The compile cache on the real engine: a package that runs compiled on this machine is
compiled once at announce, boots without compiling, and a changed engine arg compiles again.

No engine start of its own: the shared instance's embedder (all-MiniLM-L6-v2, the cheapest
model to compile here, at a small context) is that package, announced into the session's
compile cache before the instance boots from it (tests/support/compiled_embedder.py). The
changed package's miss is checked without a start of its own (its key and the reason it
misses, as announce and boot compute them; that a miss compiles is the first announce). The
session's compile cache is a temporary directory so every run starts cold.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import httpx

from podium.package.defaults import EMBEDDING_MODEL
from podium.package.package import write_manifest
from tests.support import compiled_embedder
from tests.support.compiled_embedder import Announced
from tests.support.harness import PODIUM, ROOT, RunningInstance

if TYPE_CHECKING:
    from podium.backends.vllm.compile_cache import CompileJob

# what vLLM 0.32 logs once its engine is built; the warmup is where it compiles
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
# what Podium logs when the engine wrote compiled code although the entry matched
RECOMPILED = "although Podium's compile cache matched"


def _changed_package(root: Path) -> Path:
    """The shared embedder's package with another context: another build."""
    manifest = compiled_embedder.manifest(version="compiled-256", max_model_len=256)
    return write_manifest(root / "embedder-256", manifest).root


def _job(package_root: Path) -> CompileJob:
    """The package's compile job as announce and boot compute it (in this process, its
    environment left as it was), after materializing its weights as announce does."""
    from podium.backends.vllm import engine_build
    from podium.package.cache import ModelCache
    from podium.package.package import open_package

    package = open_package(package_root)
    # the weights object is the one the first announce cached; this only writes the package's
    # ref to it (a fresh clone has never announced the changed package)
    weights = ModelCache().materialize(package).path
    with mock.patch.dict(os.environ):  # job_for sets the engine's environment
        return engine_build.job_for(package, weights, engine_build.resolve_mode(package))


def test_compiled_once_at_announce_then_boots_without_compiling(
        tmp_path: Path, announced_embedder: Announced, instance: RunningInstance) -> None:
    from podium.backends.vllm.compile_cache import CompileCache

    first, cache = announced_embedder, announced_embedder.cache
    assert first.returncode == 0, first.stderr[-3000:]
    assert "compiled artifacts built" in first.stdout, first.stdout
    [job_log] = cache.glob("*/compile.log")
    [entry] = cache.glob("*/podium-compiled.json")
    files = json.loads(entry.read_text())["files"]
    # on CPU too the build is vLLM's AOT artifact (loaded back through Podium's engine patch,
    # podium.engine_patches.aot_load)
    assert any(f.startswith("torch_compile_cache/torch_aot_compile/") for f in files), sorted(files)
    [compiling_init] = map(float, INIT.findall(job_log.read_text()))

    # the shared instance booted the embedder from that build
    reply = httpx.post(f"{instance.openai_url}/embeddings", timeout=120,
                       headers=instance.headers(),
                       json={"model": EMBEDDING_MODEL, "input": "compiled once"})
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["data"][0]["embedding"]) == 384
    log = instance.log()
    assert f"engine mode of {EMBEDDING_MODEL}@1 on cpu: compiled" in log
    assert f"compile cache hit for {EMBEDDING_MODEL}@1" in log
    assert RECOMPILED not in log, log[-4000:]
    # vLLM loaded its AOT build instead of tracing the model again
    assert "Directly load AOT compilation from path" in log, log[-4000:]
    assert "Compiling model again due to a load failure" not in log, log[-4000:]
    # the hit counter counts a boot only when the engine wrote no compiled code (no new or
    # rewritten AOT artifact, FX-graph or AOTAutograd entry)
    assert json.loads(entry.read_text())["hits"] == 1
    print(f"\ncompile at announce {first.seconds:.0f} s (engine init {compiling_init:.0f} s); "
          f"the shared instance's engine inits {INIT.findall(log)} s (LLM, embedder)")

    # the changed package misses the build, saying why, without an engine start of its own:
    # its key computed here is the one announce and boot compute (the unchanged package's
    # key, computed the same way, is the entry's), and a miss compiles (tests/backends/vllm/
    # test_compile_cache.py, on a fake engine; the first announce above, on the real one)
    assert _job(first.package).key == entry.parent.name
    changed_root = _changed_package(tmp_path)
    changed = _job(changed_root)
    assert changed.key != entry.parent.name
    compiled = CompileCache(cache)
    assert compiled.lookup(changed.key) is None
    why = compiled.why_missing(changed.factors, changed.package_key)
    assert why == "the cached build differs in engine args: max_model_len 128 → 256", why

    for package, current in ((first.package, True), (changed_root, False)):
        shown = subprocess.run([*PODIUM, "inspect", "--json", str(package)],
                               capture_output=True, text=True, env=first.env(), cwd=ROOT,
                               timeout=300)
        assert shown.returncode == 0, shown.stderr[-3000:]
        cached = json.loads(shown.stdout)["cached"]
        assert cached["engine_mode"] == "compiled"
        assert cached["compiled_cached"] is current, cached
        assert cached["compiled_key"] == _job(package).key
        # same weights: the 128 build is listed for both, current only for its own package
        [build] = cached["compiled"]
        assert build["engine_args"]["max_model_len"] == 128 and build["hits"] == 1
        assert build["current"] is current


def test_default_package_runs_eager_on_cpu_by_the_table(instance) -> None:
    """The shared instance (no extra boot) resolved the default package's `auto` to eager."""
    log = instance.log()
    assert "engine mode of smollm2-135m-instruct@1 on cpu: eager (auto on cpu:" in log
    # eager: no compile cache looked up for it (the embedder beside it runs compiled)
    assert "compile cache hit for smollm2-135m-instruct" not in log
    assert "compile cache miss for smollm2-135m-instruct" not in log
