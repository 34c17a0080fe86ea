"""Guards around vLLM behaviours that would otherwise take the engine down (fake engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from podium.backends.vllm import VllmBackend
from podium.errors import InvalidArgument
from podium.package.manifest import parse_manifest
from podium.package.package import Package


def _backend(device: str, chunked: bool, errored: bool = False) -> VllmBackend:
    manifest = parse_manifest({"name": "m", "backend": "vllm",
                               "weights": {"source": "path", "path": "/x"}})
    backend = VllmBackend(Package(root=None, manifest=manifest))  # type: ignore[arg-type]
    backend.engine = SimpleNamespace(errored=errored, vllm_config=SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked)))
    return backend


def test_seed_refused_where_it_would_crash_the_engine() -> None:
    backend = _backend("cpu", chunked=True)
    with pytest.raises(InvalidArgument, match="enable_chunked_prefill=false") as err:
        backend.check_seed(3)
    assert err.value.param == "seed"
    backend.check_seed(None)  # no seed, no problem


@pytest.mark.parametrize(("device", "chunked"), [("cpu", False), ("cuda", True)])
def test_seed_allowed_where_safe(device: str, chunked: bool) -> None:
    _backend(device, chunked).check_seed(3)


def test_dead_engine_is_reported() -> None:
    assert _backend("cpu", False).is_alive()
    assert not _backend("cpu", False, errored=True).is_alive()
