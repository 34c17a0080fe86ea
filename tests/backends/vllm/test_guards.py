"""Guards around vLLM behaviours that would otherwise take the engine down (fake engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from podium.backends.base import InferenceRequest, Tensor
from podium.backends.vllm import VllmBackend
from podium.errors import BackendDead, BackendError, InvalidArgument
from podium.errors.render import kind_of
from podium.package.manifest import parse_manifest
from podium.package.package import Package
from podium.repository import ModelEntry, ModelRepository


def _backend(device: str, chunked: bool, errored: bool = False) -> VllmBackend:
    manifest = parse_manifest({"name": "m", "backend": "vllm",
                               "weights": {"source": "path", "path": "/x"}})
    backend = VllmBackend(Package(root=None, manifest=manifest))  # type: ignore[arg-type]
    backend.engine = SimpleNamespace(errored=errored, vllm_config=SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked)))
    return backend


def test_seed_refused_where_the_engine_fix_does_not_apply(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from podium.engine_patches import cpu_seed

    monkeypatch.setattr(cpu_seed, "applies", lambda: False)  # another engine version
    backend = _backend("cpu", chunked=True)
    with pytest.raises(InvalidArgument, match="enable_chunked_prefill=false") as err:
        backend.check_seed(3)
    assert err.value.param == "seed"
    backend.check_seed(None)  # no seed, no problem


@pytest.mark.parametrize(("device", "chunked"), [("cpu", False), ("cuda", True), ("cpu", True)])
def test_seed_allowed_where_safe(device: str, chunked: bool) -> None:
    _backend(device, chunked).check_seed(3)  # ("cpu", True): the pinned engine, patched


def test_dead_engine_is_reported() -> None:
    assert _backend("cpu", False).is_alive()
    assert not _backend("cpu", False, errored=True).is_alive()


class _FailingEngine:
    """An AsyncLLM whose `generate` raises the error vLLM raises for one request."""

    def __init__(self, error: Exception, fatal: bool) -> None:
        self.errored = False
        self.error, self.fatal = error, fatal
        self.vllm_config = SimpleNamespace(
            device_config=SimpleNamespace(device_type="cuda"),
            scheduler_config=SimpleNamespace(enable_chunked_prefill=False))
        self.model_config = SimpleNamespace(max_model_len=64, max_logprobs=20,
                                            get_vocab_size=lambda: 100)

    def get_tokenizer(self) -> Any:
        return SimpleNamespace(encode=lambda text: text.split())

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        self.errored = self.fatal
        raise self.error
        yield  # an async generator, like AsyncLLM.generate


def _prompt() -> InferenceRequest:
    return InferenceRequest({"text_input": Tensor("text_input", "BYTES",
                                                  np.array([b"hi"], dtype=object))})


@pytest.mark.parametrize(("error", "fatal"), [("EngineGenerateError", False),
                                              ("EngineDeadError", True)],
                         ids=["generate-error", "engine-dead"])
async def test_vllm_engine_errors_are_fatal_only_when_the_engine_died(
        error: str, fatal: bool) -> None:
    from vllm.v1.engine import exceptions  # heavy: imported by this test only

    backend = _backend("cuda", False)
    backend.engine = _FailingEngine(getattr(exceptions, error)(), fatal)
    repository = ModelRepository()
    died: list[str] = []
    repository.on_dead = lambda entry: died.append(entry.key)
    repository._entries["m"] = {"1": ModelEntry(backend, state="READY")}
    with pytest.raises(BackendDead if fatal else BackendError) as raised:
        await repository.infer("m", None, _prompt())
    assert isinstance(raised.value, BackendDead) == fatal
    assert died == (["m@1"] if fatal else [])
    assert repository.all_ready() != fatal


@pytest.mark.parametrize("path", ["infer", "infer_stream"])
async def test_vllm_validation_error_is_a_bad_request(path: str) -> None:
    """vLLM refusing a request (VLLMValidationError, no ValueError) fails it with a 400 and
    leaves the engine serving."""
    from vllm.exceptions import VLLMValidationError

    backend = _backend("cuda", False)
    backend.engine = _FailingEngine(VLLMValidationError(
        "Token id 99999 is out of vocabulary", parameter="stop_token_ids"), fatal=False)
    with pytest.raises(InvalidArgument) as raised:
        if path == "infer":
            await backend.infer(_prompt())
        else:
            async for _ in backend.infer_stream(_prompt()):
                pass
    assert kind_of(raised.value).http_status == 400
    assert "out of vocabulary" in raised.value.message and raised.value.param == "stop_token_ids"
    assert backend.is_alive()
