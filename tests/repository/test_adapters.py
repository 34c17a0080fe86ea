"""LoRA adapters in the repository: an adapter name resolves to a view on its base's entry, a
lease on it holds the base (which drains it), and an unknown name is a 404 naming it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from podium.backends.base import AdapterCard, Backend
from podium.errors import NotFound
from podium.repository import ModelRepository
from tests.support.fake_backends import FakeEngineBackend, add_ready


class _AdapterView(FakeEngineBackend):
    def __init__(self, name: str, version: str, base: str) -> None:
        super().__init__(name, version)
        self.base = base

    @property
    def parent(self) -> str:
        return self.base


class _BaseWithAdapters(FakeEngineBackend):
    def __init__(self, versions: dict[str, list[str]]) -> None:
        super().__init__("base-llm")
        self.versions = versions
        self.views: dict[str, Backend] = {}

    def adapter(self, name: str, version: str | None) -> Backend | None:
        found = self.versions.get(name, [])
        version = version or (found[-1] if found else None)
        if version not in found:
            return None
        return self.views.setdefault(f"{name}@{version}", _AdapterView(name, version,
                                                                        self.name))

    def adapters(self) -> list[AdapterCard]:
        return [AdapterCard(n, v, 8) for n, vs in self.versions.items() for v in vs]


def _repository() -> tuple[ModelRepository, Any]:
    repository = ModelRepository()
    base = add_ready(repository, _BaseWithAdapters({"tone": ["1", "2"]}))
    return repository, base


def test_an_adapter_name_resolves_to_its_version_on_the_base() -> None:
    repository, base = _repository()
    latest = repository.find("tone")
    assert (latest.name, latest.version, latest.parent) == ("tone", "2", base)
    assert repository.find("tone", "1").version == "1"
    assert repository.find("tone", "2") is latest  # one entry per version: its stats add up


def test_a_lease_on_an_adapter_holds_the_base() -> None:
    repository, base = _repository()

    async def lease() -> None:
        async with repository.lease("tone", "1") as entry:
            assert entry.in_flight == 1 and base.in_flight == 1
            assert not base.idle.is_set()
        assert base.in_flight == 0 and base.idle.is_set()

    asyncio.run(lease())


@pytest.mark.parametrize(("name", "version", "named"), [
    ("nope", None, "'nope'"), ("tone", "3", "'tone@3'")])
def test_an_unknown_adapter_is_a_404_naming_it(name: str, version: str | None,
                                                named: str) -> None:
    repository, _ = _repository()
    with pytest.raises(NotFound, match=f"model {named} is not served here: no model or LoRA "
                                       "adapter"):
        repository.find(name, version)


def test_an_adapter_of_a_base_not_ready_is_not_served() -> None:
    repository, base = _repository()
    base.state = "UNLOADING"
    with pytest.raises(NotFound):
        repository.find("tone")
