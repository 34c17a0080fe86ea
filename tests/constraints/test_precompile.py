"""Constraints compile at admission, off the event loop, and the engine only adopts them.

The OpenAI app runs over fake vLLM serving objects (no engine), with the real tokenizer for
the compile: what reaches the "engine" is the request vLLM would get, and a real processor
is then handed its extra arguments.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm import SamplingParams

from podium.constraints.compile.precompile import KEY_XARGS, ConstraintPrecompiler
from podium.constraints.engine.processor import ConstraintLogitsProcessor
from podium.constraints.spec.admission import validate_constraint
from podium.frontends.openai import COMPILE_HEADER
from tests.support.catalog import make_titles
from tests.support.openai_instance import CHAT, ContextBackend, client_for, openai_app
from tests.support.polling import eventually

USER = [{"role": "user", "content": "pick three"}]


def _app(smol_dir: Any) -> tuple[Any, Any]:
    backend = ContextBackend()
    backend.engine = SimpleNamespace(model_config=SimpleNamespace(  # type: ignore[attr-defined]
        get_vocab_size=lambda: 49152, tokenizer=str(smol_dir)))
    return openai_app(backend)


def _processor(smol_dir: Any) -> ConstraintLogitsProcessor:
    config = SimpleNamespace(model_config=SimpleNamespace(
        tokenizer=str(smol_dir), get_vocab_size=lambda: 49152))
    return ConstraintLogitsProcessor(config, torch.device("cpu"), False)


def _chat(constraint: dict[str, Any]) -> dict[str, Any]:
    return {"model": "fake-llm", "messages": USER, "constraint": constraint}


async def test_openai_request_arrives_compiled_and_the_engine_never_compiles(
        smol_dir: Any) -> None:
    app, serving = _app(smol_dir)
    items = random.Random(5).sample(make_titles(2000), 40)
    spec = {"type": "distinct_items", "items": items, "min": 3, "max": 5}
    async with client_for(app) as client:
        first = await client.post(CHAT, json=_chat(spec))
        assert first.status_code == 200, first.text
        again = await client.post(CHAT, json=_chat(spec))  # the same spec: a cache hit
        assert again.status_code == 200, again.text
        metrics = (await client.get("/metrics")).text
    seconds = first.json()["constraint_compile_seconds"]
    assert seconds > 0 and float(first.headers[COMPILE_HEADER]) == pytest.approx(seconds,
                                                                                 abs=1e-5)
    # the second is a hit (counted below as cache="hit"), whatever its time on a loaded machine
    assert ('podium:constraint_compile_seconds_count{cache="miss",compiler="thread",'
            'type="distinct_items"}') in metrics
    assert ('podium:constraint_compile_seconds_count{cache="hit",compiler="thread",'
            'type="distinct_items"}') in metrics
    one, two = serving.requests
    key = one.vllm_xargs[KEY_XARGS]
    assert two.vllm_xargs[KEY_XARGS] == key  # identical specs share one compiled form
    # the engine side: a processor of another "process" (its own store object, same host
    # directory) adopts the form by key, without a tokenizer and without compiling
    proc = _processor(smol_dir)
    for slot, request in enumerate((one, two)):
        proc.add_request(slot, SamplingParams(extra_args=dict(request.vllm_xargs)))
    assert proc.engine_compiles == 0 and proc._compiler is None
    assert proc._batch is not None and proc._batch.num_forms == 1


def _refuse_at_compile(spec: dict[str, Any], tok: Any) -> Any:
    raise ValueError(f"token {spec['token']} is not in this vocabulary")


async def test_a_spec_that_cannot_compile_is_a_400_before_the_engine(
        smol_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from podium.constraints.spec import registry

    # a type whose specs validate but whose compile refuses them (as a plugin's may)
    broken = registry.ConstraintType("refuses", lambda spec: dict(spec), _refuse_at_compile)
    monkeypatch.setitem(registry._TYPES, "refuses", broken)
    app, serving = _app(smol_dir)
    async with client_for(app) as client:
        r = await client.post(CHAT, json=_chat({"type": "refuses", "token": 99}))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "constraint"
        assert "cannot be compiled" in error["message"] and "token 99" in error["message"]
        assert serving.requests == []  # nothing reached the engine
        good = await client.post(CHAT, json=_chat({"type": "choice", "choices": ["Heat"]}))
        assert good.status_code == 200, good.text
    assert KEY_XARGS in serving.requests[0].vllm_xargs


def test_a_spec_not_compiled_at_admission_is_compiled_in_the_engine_and_counted(
        smol_dir: Any) -> None:
    from podium.constraints.spec.admission import to_vllm_xargs

    proc = _processor(smol_dir)
    spec = validate_constraint({"type": "choice", "choices": ["Heat", "Alien"]})
    proc.add_request(0, SamplingParams(extra_args=to_vllm_xargs(spec)))
    proc.add_request(1, SamplingParams(extra_args={**to_vllm_xargs(spec),
                                                   KEY_XARGS: "0" * 40}))  # gone from store
    assert proc.engine_compiles == 2


async def test_identical_specs_arriving_together_compile_once(smol_dir: Any) -> None:
    compiler = ConstraintPrecompiler(str(smol_dir), 49152)
    compiler.compile_now(validate_constraint({"type": "choice", "choices": ["warm"]}))
    puts = []
    real_put = compiler.store.put
    compiler.store.put = lambda form: (puts.append(form.key), real_put(form))  # type: ignore
    spec = validate_constraint({"type": "choice", "choices": make_titles(3000)[1000:]})
    results = await asyncio.gather(*(compiler.compile(spec) for _ in range(8)))
    assert len({r.key for r in results}) == 1 and len(puts) == 1  # one compile for all 8
    assert compiler.store.directory.joinpath(results[0].key + ".form").exists()
    again = await compiler.compile(spec)
    assert again.cached and again.key == results[0].key and len(puts) == 1  # found, not rebuilt


async def test_compiling_leaves_the_event_loop_serving(smol_dir: Any) -> None:
    # the in-process pool (a worker process is off the loop by construction)
    compiler = ConstraintPrecompiler(str(smol_dir), 49152, process=False)
    compiler.compile_now(validate_constraint({"type": "choice", "choices": ["warm"]}))
    spec = validate_constraint({"type": "choice", "choices": make_titles(20000)})
    entered, loop_ran = threading.Event(), threading.Event()
    served_during: list[bool] = []
    real = compiler._compile

    def held(normalized: dict[str, Any], canonical: str) -> Any:
        entered.set()
        # the compile goes on only once the event loop has run a task meanwhile: on the loop,
        # it would block that task and wait out the 10 s
        served_during.append(loop_ran.wait(10))
        return real(normalized, canonical)

    async def serving() -> None:
        await asyncio.to_thread(entered.wait, 10)
        loop_ran.set()

    compiler._compile = held  # type: ignore[method-assign]
    task = asyncio.create_task(serving())
    try:
        await asyncio.wait_for(compiler.compile(spec), 30)
    finally:
        loop_ran.set()
        await task
        compiler.shutdown()
    assert served_during == [True]


def test_the_host_directory_is_trimmed_beside_the_compiles_oldest_first(
        smol_dir: Any, tmp_path: Any) -> None:
    """Past its byte budget the directory drops its oldest forms; the scan runs in its own
    thread, not inside a request's compile, and only once the directory may be over budget."""
    from podium.constraints.compile.store import FormStore

    store = FormStore(tmp_path / "forms", max_dir_bytes=64 << 10)
    compiler = ConstraintPrecompiler(str(smol_dir), 49152, store=store)
    keys = [compiler.compile_now(validate_constraint(
        {"type": "choice", "choices": [f"title {i}", f"other {i}"]})).key for i in range(256)]
    # the lock is taken by a put past the budget until its scan is done
    assert eventually(lambda: not store._trimming.locked(), 30), "the trim never finished"
    files = list((tmp_path / "forms").glob("*.form"))
    assert sum(f.stat().st_size for f in files) <= 64 << 10
    assert (tmp_path / "forms" / f"{keys[-1]}.form").exists()  # the newest stays
    assert not (tmp_path / "forms" / f"{keys[0]}.form").exists()  # the oldest went


def test_the_host_directory_is_scanned_only_when_it_may_be_over_budget(tmp_path: Any) -> None:
    """A scan holds the GIL beside the compiles: one when the store starts writing, then only
    once what it wrote since could take the directory past its budget."""
    import numpy as np

    from podium.constraints.compile import store as store_module
    from podium.constraints.compile.form import FIELDS, TABLE, CompiledForm
    from podium.constraints.compile.store import FormStore

    def form(i: int) -> CompiledForm:
        arrays = {name: np.zeros(2 if name == "offsets" else 0, dtype=dtype)
                  for name, dtype in FIELDS.items()}
        return CompiledForm(f"{i:040x}", TABLE, arrays, start=0)

    size = len(form(0).to_bytes())
    store = FormStore(tmp_path / "forms", max_dir_bytes=100 * size)
    scans: list[int] = []
    trim = store._trim

    def counted() -> None:
        scans.append(store._puts)
        trim()

    store._trim = counted  # type: ignore[method-assign]

    def settle() -> None:
        deadline = time.monotonic() + 10
        while store._trimming.locked():
            assert time.monotonic() < deadline, "the scan never finished"
            time.sleep(0.01)

    store.put(form(0))
    settle()
    for i in range(1, 100):
        store.put(form(i))
    settle()
    assert scans == [1]  # the first put's; 100 forms are within the budget of 100
    store.put(form(100))  # past the budget: a scan, down to 90%
    settle()
    assert len(scans) == 2
    assert len(list((tmp_path / "forms").glob("*.form"))) == int(100 * store_module.TRIM_TO)
    for i in range(101, 105):  # back under the budget after the trim: no scan
        store.put(form(i))
    settle()
    assert len(scans) == 2
