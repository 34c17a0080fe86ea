"""LoRA adapters on the shared real instance (its LLM has `lora` on; tests/conftest.py): each
adapter answers as PEFT on transformers does, a full mixed batch answers every request with its
own adapter (the base with none: Podium's engine patch `lora_slots`), adapters are found in the
cache per request, by version, over OpenAI and KServe, and one the base cannot serve fails
alone."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from podium.package.adapter_base import store_adapter
from podium.package.adapter_store import AdapterStore
from podium.package.package import open_package
from tests.conftest import API_KEY, LLM, LORA_CPU_SLOTS, LORA_SLOTS, MAX_NUM_QUEUED_TOKENS
from tests.support.lora_adapters import write_adapter_package

pytestmark = pytest.mark.engine
PROMPT = "The three most important things to know about the ocean are"
TOKENS = 16
NEAR_TIE = 0.05
"""Log-prob gap under which two tokens are a tie in bf16 (measured: 0.000 at the tie seen)."""
BATCH_ROUNDING = 0.3
"""How far one token's log-prob moves between batch sizes on vLLM's CPU bf16 kernels
(measured: 0.125 at the 2nd token, base alone vs 10 base requests; see `as_the_base`)."""
TOP = 5


@dataclass
class Adapters:
    names: list[str]
    folders: list[Path]
    base_answer: str
    """The base's answer before any adapter was loaded."""
    make: object


def complete(client: openai.OpenAI, model: str, prompt: str = PROMPT, **options) -> str:
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS,
                                       temperature=0, **options)
    return answer.choices[0].text


@pytest.fixture(scope="module")
def adapters(openai_client: openai.OpenAI, model_repository: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Adapters]:
    base_answer = complete(openai_client, LLM)
    base = open_package(model_repository / LLM)
    tag = uuid.uuid4().hex[:6]  # the cache is shared with other runs on this machine
    folder = tmp_path_factory.mktemp("adapters")

    def make(name: str, seed: int, version: str = "1", **kwargs) -> Path:
        package = write_adapter_package(folder / f"{name}-{version}", name, version=version,
                                        seed=seed, bf16=True, **kwargs)
        store_adapter(open_package(package), base)  # as `podium announce` does
        return package

    names = [f"tone{i}-{tag}" for i in range(LORA_CPU_SLOTS + 1)]
    folders = [make(name, seed=i) for i, name in enumerate(names)]
    yield Adapters(names, folders, base_answer, make)
    # the shared instance serves what the cache holds: leave it as this module found it
    store = AdapterStore()
    for stored in store.list_for(base.key):
        if stored.info.name.endswith(f"-{tag}"):
            store.remove(base.key, stored.info.name, stored.info.version)


def test_an_adapter_answers_as_peft_on_transformers_and_not_as_the_base(
        adapters: Adapters, openai_client: openai.OpenAI, default_model_dir: Path) -> None:
    served = complete(openai_client, f"{adapters.names[0]}@1")
    assert served != adapters.base_answer
    # greedy on both sides, but bf16 kernels differ: where PEFT's top two tokens tie (0.000
    # apart here at the 8th token) either is the same answer; anything else is not
    margins = _peft_margins(default_model_dir, adapters.folders[0], PROMPT, served)
    assert len(margins) >= TOKENS - 1 and max(margins) <= NEAR_TIE, margins


def test_a_full_mixed_batch_answers_each_request_with_its_own_adapter(
        adapters: Adapters, openai_client: openai.OpenAI) -> None:
    models = [LLM] + [f"{name}@1" for name in adapters.names[:LORA_SLOTS]]
    alone = {model: scored(openai_client, model) for model in models}
    # every slot now holds an adapter: vLLM's CPU ops read "no adapter" (-1) as the last one
    assert alone[LLM].text == adapters.base_answer
    assert len({answer.text for answer in alone.values()}) == len(models), alone
    # the check below tells an adapter's answer from the base's (else it proves nothing)
    assert not any(as_the_base(alone[model], alone[LLM]) for model in models[1:])
    for _ in range(3):
        with ThreadPoolExecutor(len(models) * 2) as pool:
            together = list(pool.map(lambda m: (m, scored(openai_client, m)), models * 2))
        for model, answer in together:
            if model == LLM:  # never an adapter's delta, only batch-size rounding
                assert as_the_base(answer, alone[LLM]), (answer, alone[LLM])
            else:
                assert as_the_base(answer, alone[model]), (model, answer, alone[model])


@dataclass
class Scored:
    text: str
    tokens: list[str]
    logprobs: list[float]
    top: list[dict[str, float]]


def scored(client: openai.OpenAI, model: str) -> Scored:
    answer = client.completions.create(model=model, prompt=PROMPT, max_tokens=TOKENS,
                                       temperature=0, logprobs=TOP).choices[0]
    lp = answer.logprobs
    return Scored(answer.text, list(lp.tokens), list(lp.token_logprobs), list(lp.top_logprobs))


def as_the_base(answer: Scored, reference: Scored) -> bool:
    """Whether `answer` is `reference` computed in another batch: the same tokens with
    log-probs within bf16 rounding, up to a first differing token (if any) where the two
    tie within that rounding. A batch of 10 base requests (no adapter at all) already picks
    '\\n\\n' over '\\n' at the 2nd token, 0.125 nats apart, where the base alone picks
    '\\n': vLLM's CPU matmuls round differently by batch size. After such a tie the context
    differs, so nothing after it compares."""
    for token, logprob, top, expected, expected_lp in zip(
            answer.tokens, answer.logprobs, answer.top, reference.tokens, reference.logprobs,
            strict=False):
        if token != expected:
            return expected in top and logprob - top[expected] <= BATCH_ROUNDING
        if abs(logprob - expected_lp) > BATCH_ROUNDING:
            return False
    return True


def test_adapters_load_on_first_use_and_come_back_after_lru_eviction(
        adapters: Adapters, openai_client: openai.OpenAI, instance) -> None:
    first = [complete(openai_client, f"{name}@1") for name in adapters.names]  # > max_cpu_loras
    again = [complete(openai_client, f"{name}@1") for name in adapters.names]
    assert again == first
    loads = _metric(instance, "podium:adapter_loads_total",
                    adapter=adapters.names[0], outcome="ok")
    assert loads == 1.0  # loaded by Podium once; vLLM reloads an evicted one from its path


def test_a_bare_name_is_the_highest_version_and_models_lists_adapters_under_the_base(
        adapters: Adapters, openai_client: openai.OpenAI, instance) -> None:
    name = adapters.names[1]
    first = complete(openai_client, f"{name}@1")
    adapters.make(name, seed=101, version="2")  # announced while the instance serves
    second = complete(openai_client, f"{name}@2")
    assert second != first
    assert complete(openai_client, name) == second
    assert complete(openai_client, f"{name}@1") == first
    cards = {card.id: card for card in openai_client.models.list().data}
    card = cards[name].model_dump()
    assert card["parent"] == LLM and card["version"] == "2" and card["versions"] == ["1", "2"]


def test_an_unknown_adapter_is_a_404_naming_it_then_a_good_request(
        adapters: Adapters, openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="no-such-tone"):
        complete(openai_client, "no-such-tone")
    with pytest.raises(openai.NotFoundError, match=f"{adapters.names[0]}@7"):
        complete(openai_client, f"{adapters.names[0]}@7")
    assert complete(openai_client, f"{adapters.names[0]}@1")


def test_an_adapter_the_base_cannot_serve_fails_alone(adapters: Adapters,
                                                     openai_client: openai.OpenAI) -> None:
    tag = adapters.names[0].rsplit("-", 1)[1]
    store = AdapterStore()
    # written straight into the cache (no announce checks): the instance checks again
    wide = write_adapter_package(adapters.folders[0].parent / "wide", f"wide-{tag}", seed=5,
                                 rank=32)
    store.materialize(open_package(wide))
    with pytest.raises(openai.BadRequestError, match=r"rank=32 is above the max_lora_rank=16"):
        complete(openai_client, f"wide-{tag}")
    broken = write_adapter_package(adapters.folders[0].parent / "broken", f"broken-{tag}",
                                   seed=6)
    weights = broken / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])  # header intact
    store.materialize(open_package(broken))
    with pytest.raises(openai.InternalServerError, match=f"broken-{tag}@1 failed to load"):
        complete(openai_client, f"broken-{tag}")
    assert complete(openai_client, f"{adapters.names[0]}@1")
    assert complete(openai_client, LLM) == adapters.base_answer


def test_kserve_generate_infer_and_stream_reach_the_adapter_by_version(
        adapters: Adapters, openai_client: openai.OpenAI, instance) -> None:
    import numpy as np
    import tritonclient.http as http

    name = adapters.names[2]
    expected = complete(openai_client, f"{name}@1")
    url = f"{instance.http_url}/v2/models/{name}/versions/1"
    body = {"text_input": PROMPT, "parameters": {"max_tokens": TOKENS, "temperature": 0}}
    headers = {"authorization": f"Bearer {API_KEY}"}
    r = httpx.post(f"{url}/generate", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["model_name"] == name and expected in r.json()["text_output"]
    with httpx.stream("POST", f"{url}/generate_stream", json=body, headers=headers,
                      timeout=120) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert len(events) >= 2
    client = http.InferenceServerClient(instance.http_url.removeprefix("http://"))
    text = http.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    params = http.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([b'{"max_tokens": 16, "temperature": 0}'],
                                        dtype=object))
    before = _metric(instance, "podium:adapter_tokens_total", adapter=name, kind="completion")
    result = client.infer(name, [text, params], model_version="1", headers=dict(headers))
    assert expected in result.as_numpy("text_output")[0].decode()
    # KServe answers carry no usage: the adapter's tokens are counted from the engine's
    # outputs (the answer may end before max_tokens: 4 tokens in the run of 2026-12-03)
    after = _metric(instance, "podium:adapter_tokens_total", adapter=name, kind="completion")
    assert 1 <= after - before <= TOKENS, (before, after)
    assert _metric(instance, "podium:requests_total", model=name, protocol="kserve_http",
                   code="200") >= 3


@pytest.mark.parametrize("options", [
    pytest.param({"n": 2, "logprobs": 2, "temperature": 0.8, "seed": 7}, id="n-and-logprobs"),
    pytest.param({"extra_body": {"constraint": {"type": "choice",
                                                "choices": ["calm", "wild"]}}},
                 id="podium-constraint"),
    pytest.param({"extra_body": {"response_format": {"type": "json_object"}},
                  "max_tokens": 24}, id="response-format"),
])
def test_an_adapter_request_keeps_every_request_option(adapters: Adapters,
                                                       openai_client: openai.OpenAI,
                                                       options: dict) -> None:
    options = dict(options)
    answer = openai_client.completions.create(
        model=f"{adapters.names[3]}@1", prompt=PROMPT,
        max_tokens=options.pop("max_tokens", TOKENS),
        temperature=options.pop("temperature", 0), **options)
    if "n" in options:
        assert len(answer.choices) == 2 and answer.choices[0].logprobs.top_logprobs
    elif "constraint" in options["extra_body"]:
        assert answer.choices[0].text in ("calm", "wild")
    else:
        assert answer.choices[0].text.lstrip().startswith("{")


def test_adapter_requests_and_tokens_are_on_metrics_by_adapter(
        adapters: Adapters, openai_client: openai.OpenAI, instance) -> None:
    name = adapters.names[4]
    stream = openai_client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
        temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    complete(openai_client, name)
    assert _metric(instance, "podium:requests_total", model=name, code="200") >= 2
    assert _metric(instance, "podium:adapter_tokens_total", adapter=name,
                   kind="completion") >= TOKENS
    text = httpx.get(f"{instance.http_url}/metrics", timeout=30).text
    assert "vllm:lora_requests_info" in text


@pytest.mark.parametrize("protocol", ["openai", "grpc"])
def test_adapter_clients_that_vanish_leave_the_engine_idle_then_the_adapter_serves(
        adapters: Adapters, openai_client: openai.OpenAI, instance, protocol: str) -> None:
    """Cancellation: long adapter generations whose clients leave (half mid-stream) are all
    dropped by the engine (its running and waiting requests back to 0)."""
    import asyncio

    from tests.support.vanishing import grpc_client, vanish
    from tests.support.vanishing import openai_client as leaving_chat

    name = f"{adapters.names[5]}@1"
    complete(openai_client, name)  # loaded: what is measured is the cancellation

    def client(index: int, streams):
        if protocol == "openai":
            return leaving_chat(instance.http_url, name, index, streams,
                                {"Authorization": f"Bearer {API_KEY}"})
        return grpc_client(instance.grpc_url, adapters.names[5], index, streams,
                           (("authorization", f"Bearer {API_KEY}"),))

    give_up_s = 30
    idle_after_s = asyncio.run(vanish(instance.http_url, LLM, client, 8, give_up_s=give_up_s))
    assert idle_after_s < give_up_s  # every vanished client's generation was dropped
    assert complete(openai_client, name)


def test_an_adapter_burst_past_admission_control_is_429s_then_the_adapter_serves(
        adapters: Adapters, openai_client: openai.OpenAI, instance) -> None:
    """Admission control: a burst of long adapter prompts past the engine's prefill backlog
    (`--max-num-queued-tokens`) is answered 200 or 429 naming the limit, never a 5xx, on
    OpenAI and KServe; the 429s are the adapter's errors on /metrics."""
    name = adapters.names[6]
    complete(openai_client, name)
    headers = {"authorization": f"Bearer {API_KEY}"}
    prompt = "hello " * (MAX_NUM_QUEUED_TOKENS // 3 + 200)
    refused_before = _metric(instance, "podium:requests_total", model=name, code="429")

    def one(index: int) -> httpx.Response:
        if index % 2:
            return httpx.post(f"{instance.http_url}/v2/models/{name}/generate", headers=headers,
                              timeout=300, json={"text_input": prompt,
                                                 "parameters": {"max_tokens": 1}})
        return httpx.post(f"{instance.http_url}/v1/completions", headers=headers, timeout=300,
                          json={"model": name, "prompt": prompt, "max_tokens": 1})

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(16)))
    statuses = [r.status_code for r in answers]
    assert set(statuses) <= {200, 429} and 429 in statuses and 200 in statuses, statuses
    for r in answers:
        if r.status_code == 429:
            assert "max_num_queued_tokens" in r.text and r.headers["Retry-After"] == "1", r.text
    assert (_metric(instance, "podium:requests_total", model=name, code="429")
            - refused_before) == statuses.count(429)
    assert complete(openai_client, name)


def _metric(instance, sample: str, **labels: str) -> float:
    """The sum of /metrics samples named `sample` whose labels include `labels` (parsed by
    prometheus_client: a label value may hold braces, e.g. KServe's route templates)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{instance.http_url}/metrics", timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def _peft_margins(base_dir: Path, adapter: Path, prompt: str, served: str) -> list[float]:
    """Per served token: how far below PEFT-on-transformers' greedy choice it is (log-prob,
    0 where it is PEFT's choice), with the served tokens fed back as PEFT's own context."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(model, adapter, autocast_adapter_dtype=False).eval()
    prompt_ids = tokenizer(prompt)["input_ids"]
    served_ids = tokenizer(served, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + served_ids])).logits[0].float()
    rows = torch.log_softmax(logits, -1)[len(prompt_ids) - 1:-1]
    return [float(row.max() - row[token]) for row, token in zip(rows, served_ids, strict=True)]
