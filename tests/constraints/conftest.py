"""Fixtures for constraint tests: the default model's tokenizer and a catalog of titles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def smol_dir(default_model_dir: Path) -> Path:
    """The default model, materialized by the session (tests/conftest.py)."""
    return default_model_dir


@pytest.fixture(scope="session")
def tok(smol_dir: Path):
    from podium.constraints.vocab import TokenizerInfo

    return TokenizerInfo.from_pretrained(str(smol_dir))
