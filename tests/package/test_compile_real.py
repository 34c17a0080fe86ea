"""The compile cache on the real engine: a package that runs compiled on this machine is
compiled once at announce, boots without compiling, and a changed engine arg compiles again.

Three engine starts of the embedding model (all-MiniLM-L6-v2: 6 layers, the cheapest model
to compile here) at a small context: announce, boot, announce of the changed package. The
compile cache lives in a temporary directory so every run starts cold.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from podium.package.defaults import EMBEDDING_MODEL, embedding_manifest
from podium.package.package import write_manifest
from tests.support.harness import PODIUM, ROOT, running_instance

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


@pytest.fixture
def compile_env(tmp_path: Path, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("PODIUM_COMPILE_CACHE", str(tmp_path / "compiled"))
    return {**os.environ}


@pytest.mark.engine
@pytest.mark.timeout(1800)  # three engine starts, two of them compiling
def test_compiled_once_at_announce_then_boots_without_compiling(
        tmp_path: Path, compile_env: dict[str, str]) -> None:
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

    # the changed package compiles while the first one boots from its build (another key,
    # another lock: neither waits for the other, and the suite saves one engine start)
    out_path, err_path = tmp_path / "changed.out", tmp_path / "changed.err"
    with out_path.open("w") as out, err_path.open("w") as err:  # a pipe could fill and block
        changed = subprocess.Popen([*PODIUM, "materialize", str(_package(tmp_path, 256))],
                                   stdout=out, stderr=err, env=compile_env, cwd=ROOT)
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

    changed.wait(timeout=900)
    out, err = out_path.read_text(), err_path.read_text()
    assert changed.returncode == 0, err[-3000:]
    assert "compiled artifacts built" in out, out
    assert "engine args: max_model_len 128 → 256" in err, err[-3000:]
    assert len(list((tmp_path / "compiled").glob("*/compile.log"))) == 2

    shown = subprocess.run([*PODIUM, "inspect", "--json", str(_package(tmp_path, 128))],
                           capture_output=True, text=True, env=compile_env, cwd=ROOT,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    cached = json.loads(shown.stdout)["cached"]
    assert cached["engine_mode"] == "compiled" and cached["compiled_cached"]
    builds = {b["engine_args"]["max_model_len"]: b for b in cached["compiled"]}
    assert set(builds) == {128, 256}  # same weights: both builds are shown
    assert builds[128]["current"] and not builds[256]["current"]
    assert builds[128]["hits"] == 1 and builds[256]["hits"] == 0


def test_default_package_runs_eager_on_cpu_by_the_table(instance) -> None:
    """The shared instance (no extra boot) resolved the default package's `auto` to eager."""
    log = instance.log()
    assert "engine mode of smollm2-135m-instruct@1 on cpu: eager (auto on cpu:" in log
    assert "compile cache hit" not in log and "compile cache miss" not in log  # eager
