"""Fixtures of the pipeline tests (helpers: tests/support/pipelines.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.pipelines import FakeModels, write_catalog


@pytest.fixture
def models() -> FakeModels:
    return FakeModels()


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return write_catalog(tmp_path / "catalog.db")
