"""Fixtures for constraint tests: the default model's tokenizer and a catalog of titles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

@pytest.fixture(scope="session")
def smol_dir() -> Path:
    return Path(os.environ.get("PODIUM_TEST_MODEL_DIR", "/tmp/proto/smol"))


@pytest.fixture(scope="session")
def tok(smol_dir: Path):
    from podium.constraints.vocab import TokenizerInfo

    return TokenizerInfo.from_pretrained(str(smol_dir))
