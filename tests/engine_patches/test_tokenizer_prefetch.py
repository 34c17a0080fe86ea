"""The engine core's tokenizer loaded beside its worker's start (`engine_patches.
tokenizer_prefetch`): started once the worker exists, joined before vLLM's own load, which
then finds it cached; a failing prefetch leaves vLLM's load as it was."""

from __future__ import annotations

import threading
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from podium.engine_patches import tokenizer_prefetch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def state(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    fresh: dict[str, Any] = {}
    monkeypatch.setattr(tokenizer_prefetch, "_state", fresh)
    return fresh


def _config(skip: bool = False) -> Any:
    return SimpleNamespace(model_config=SimpleNamespace(skip_tokenizer_init=skip, name="m"))


def test_the_load_starts_when_the_worker_is_awaited_and_is_joined_before_vllms(
        state: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.tokenizers

    order: list[str] = []
    release = threading.Event()

    def load(model_config: Any) -> str:
        order.append("prefetch started")
        release.wait(5)
        order.append("prefetch done")
        return "tokenizer"

    monkeypatch.setattr(vllm.tokenizers, "cached_tokenizer_from_config", load)

    class Executor:
        vllm_config = _config()

        def _init_executor(self) -> None:
            order.append("executor start")

    tokenizer_prefetch._remembering(Executor._init_executor)(Executor())
    wait = tokenizer_prefetch._prefetching(lambda handles: order.append("worker ready"))
    wait(["handle"])
    wait(["handle"])  # started once
    assert state["thread"].is_alive() and order.count("worker ready") == 2  # loading beside
    joined = tokenizer_prefetch._joining(lambda **kw: order.append("vllm's load") or "tok")
    release.set()
    assert joined(model_config=None) == "tok"
    assert order.index("prefetch done") < order.index("vllm's load")
    assert order.count("prefetch started") == 1


def test_nothing_is_started_without_a_tokenizer_and_a_failure_is_vllms_own_load(
        state: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.tokenizers

    state["config"] = _config(skip=True)
    tokenizer_prefetch.start()
    assert "thread" not in state

    def broken(model_config: Any) -> None:
        raise OSError("no tokenizer.json")

    monkeypatch.setattr(vllm.tokenizers, "cached_tokenizer_from_config", broken)
    state["config"] = _config()
    tokenizer_prefetch.start()
    assert tokenizer_prefetch._joining(lambda **kw: "vllm loads it")() == "vllm loads it"


def test_the_plugin_is_declared_and_patches_the_pinned_engine(monkeypatch) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins["podium_tokenizer_prefetch"] == \
        "podium.engine_patches.tokenizer_prefetch:register"
    assert tokenizer_prefetch.applies()
    import vllm.v1.structured_output as structured
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc

    for owner, name in ((MultiprocExecutor, "_init_executor"),
                        (structured, "cached_tokenizer_from_config")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(WorkerProc, "wait_for_ready", WorkerProc.__dict__["wait_for_ready"])
    tokenizer_prefetch.register()
    assert getattr(MultiprocExecutor._init_executor, "_podium_tokenizer_prefetch", False)
    assert structured.cached_tokenizer_from_config.__wrapped__ is not None
