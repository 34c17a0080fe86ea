"""The compile worker process: a server's built-in constraints compile beside it, not under its
GIL; the answers, the failures and the worker's own death, on the real tokenizer and the real
subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from podium.constraints.compile import process as compile_process
from podium.constraints.compile.precompile import ConstraintPrecompiler
from podium.constraints.compile.store import FormStore
from podium.constraints.spec.admission import validate_constraint
from podium.errors import InvalidArgument
from podium.metrics.server import REGISTRY
from tests.support.catalog import make_titles
from tests.support.polling import async_eventually

TITLES = make_titles(4000)


def _spec(n: int, start: int = 0) -> dict[str, Any]:
    return validate_constraint({"type": "distinct_items", "items": TITLES[start:start + n],
                                "min": 3, "max": 5})


async def _ready(compiler: ConstraintPrecompiler, timeout_s: float = 120) -> Any:
    """The worker, once it has said ready (the first compile starts it)."""
    worker = compiler._worker
    assert await async_eventually(worker.ready, timeout_s), \
        "the compile worker never became ready"
    return worker


def _work_count() -> float:
    """Compiles the worker did, as the server's metrics record them."""
    return REGISTRY.get_sample_value("podium:constraint_compile_work_seconds_count",
                                     {"type": "distinct_items", "compiler": "process"}) or 0.0


def _tokenized() -> float:
    return REGISTRY.get_sample_value("podium:constraint_strings_tokenized_total",
                                     {"type": "distinct_items"}) or 0.0


@pytest.fixture
async def compiler(smol_dir: Path, tmp_path: Path) -> Any:
    compiler = ConstraintPrecompiler(str(smol_dir), 49152, store=FormStore(tmp_path / "forms"),
                                     process=True)
    yield compiler
    compiler.shutdown()
    proc = compiler._worker._proc
    if proc is not None:  # let it exit while its event loop still runs
        await asyncio.wait_for(proc.wait(), 30)


async def test_specs_compile_in_the_worker_and_the_engine_adopts_its_forms(
        compiler: ConstraintPrecompiler, smol_dir: Path) -> None:
    first = await compiler.compile(_spec(40))  # starts the worker; the pool compiles this one
    assert first.compiler == "thread" and not first.cached
    worker = await _ready(compiler)
    spec = _spec(200, 100)
    asked = worker._next_id
    work, tokenized = _work_count(), _tokenized()
    results = await asyncio.gather(*(compiler.compile(spec) for _ in range(6)))
    assert {r.compiler for r in results} == {"process"} and len({r.key for r in results}) == 1
    assert worker._next_id == asked + 1  # identical specs in flight: one compile
    # and its own time and its 200 new titles recorded once, not by each of the 6 waiters
    assert _work_count() == work + 1 and _tokenized() == tokenized + 200
    assert compiler.store.directory.joinpath(results[0].key + ".form").exists()
    again = await compiler.compile(spec)
    assert again.cached and again.key == results[0].key
    # the worker's form is the one the server's threads make: the same key, the same tables
    threads = ConstraintPrecompiler(str(smol_dir), 49152, process=False,
                                    store=FormStore(compiler.store.directory.parent / "own"))
    own = threads.compile_now(spec)
    threads.shutdown()
    assert own.key == results[0].key
    theirs = FormStore(compiler.store.directory).get(own.key)
    mine = threads.store.get(own.key)
    assert theirs is not None and mine is not None and theirs.kind == mine.kind
    assert theirs.arrays.keys() == mine.arrays.keys()
    for name, array in mine.arrays.items():
        assert np.array_equal(theirs.arrays[name], array), name


async def test_a_request_that_goes_away_leaves_the_compile_its_twins_wait_for(
        compiler: ConstraintPrecompiler) -> None:
    await compiler.compile(_spec(20))
    worker = await _ready(compiler)
    spec = _spec(300, 7)
    asked = worker._next_id
    waiting = [asyncio.ensure_future(compiler.compile(spec)) for _ in range(3)]
    await asyncio.sleep(0)  # all three in flight on one compile
    waiting[0].cancel()
    first, second = await asyncio.gather(*waiting[1:])
    assert waiting[0].cancelled() and worker._next_id == asked + 1
    assert first.key == second.key and first.compiler == second.compiler == "process"


async def test_a_spec_the_worker_cannot_compile_fails_alone(
        compiler: ConstraintPrecompiler) -> None:
    await compiler.compile(_spec(20))
    worker = await _ready(compiler)
    pid = worker._proc.pid
    bad = validate_constraint({"type": "regex", "pattern": "a[^\\s\\S]b"})  # matches nothing
    with pytest.raises(InvalidArgument) as caught:
        await compiler.compile(bad)
    assert caught.value.param == "constraint.pattern"
    assert "cannot be compiled" in caught.value.message
    good = await compiler.compile(_spec(30, 500))
    assert good.compiler == "process" and good.key and worker._proc.pid == pid


async def test_a_worker_that_dies_mid_compile_loses_no_request(
        compiler: ConstraintPrecompiler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_process, "RESTART_AFTER_S", 0.0)
    await compiler.compile(_spec(20))
    worker = await _ready(compiler)
    dead = worker._proc.pid
    big = validate_constraint({"type": "choice", "choices": make_titles(30000)[4000:]})
    pending = asyncio.ensure_future(compiler.compile(big))
    assert await async_eventually(lambda: worker._waiting)  # the spec is in the worker
    os.kill(dead, signal.SIGKILL)
    result = await pending
    assert result.key and result.compiler == "thread"  # the server's threads took it over
    again = await _ready(compiler)  # started again by the next compile
    assert again._proc.pid != dead and again.starts == 2
    assert (await compiler.compile(_spec(25, 900))).compiler == "process"


async def test_plugin_types_and_unencodable_specs_stay_in_the_server(
        compiler: ConstraintPrecompiler, monkeypatch: pytest.MonkeyPatch) -> None:
    from podium.constraints.spec import registry

    await compiler.compile(_spec(20))
    await _ready(compiler)
    choice = registry.constraint_type("choice")
    assert choice is not None
    plugin = registry.ConstraintType("my-choice", choice.validate, choice.compile)
    monkeypatch.setitem(registry._TYPES, "my-choice", plugin)  # registered in this process only
    spec = {**validate_constraint({"type": "choice", "choices": ["Heat", "Alien"]}),
            "type": "my-choice"}
    assert (await compiler.compile(spec)).compiler == "thread"
    # a lone surrogate cannot travel as UTF-8: the server's threads refuse it (a 400), as they
    # would without a worker
    lone = validate_constraint({"type": "choice", "choices": ["a\ud800b", "Heat"]})
    with pytest.raises(InvalidArgument, match="cannot be compiled"):
        await compiler.compile(lone)
    assert (await compiler.compile(_spec(21, 40))).compiler == "process"


async def test_the_worker_exits_when_the_server_closes_its_input(
        compiler: ConstraintPrecompiler) -> None:
    await compiler.compile(_spec(20))
    worker = await _ready(compiler)
    proc = worker._proc
    compiler.shutdown()
    assert await asyncio.wait_for(proc.wait(), 30) == 0
