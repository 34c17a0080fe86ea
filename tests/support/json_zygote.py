"""A real zygote that preloads only `json` (fast to start), for tests of forking through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from podium.preload.spawn import Zygote
from tests.support.polling import eventually


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[Zygote]:
    """A started zygote in `tmp_path` with `json` preloaded; stopped after the test."""
    found = Zygote(tmp_path, modules=["json"])
    found.start()
    assert eventually(found.ready, timeout_s=30), "the zygote never said ready"
    yield found
    found.stop()
