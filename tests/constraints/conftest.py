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
def smol_dtype(smol_dir: Path) -> str:
    """The dtype Podium's `precision: auto` serves the default model at here (float32 on a CPU
    without bf16 instructions, where bf16 runs 5-6x slower), for tests that build vLLM's `LLM`
    themselves."""
    from tests.support.constrained_run import dtype_for

    return dtype_for(smol_dir)


@pytest.fixture(scope="session")
def tok(smol_dir: Path):
    from podium.constraints.compile.vocab import TokenizerInfo

    return TokenizerInfo.from_pretrained(str(smol_dir))


@pytest.fixture(scope="session", autouse=True)
def constraint_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compiled constraints go to a directory of this session, not the host's shared one."""
    path = tmp_path_factory.mktemp("constraint-cache")
    os.environ["PODIUM_CONSTRAINT_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def precompiler(smol_dir: Path):
    """What the frontend compiles requests with, for the default model's tokenizer."""
    from podium.constraints.compile.precompile import ConstraintPrecompiler

    return ConstraintPrecompiler(str(smol_dir), 49152)


@pytest.fixture(scope="session")
def constrained_run(smol_dir: Path, constraint_cache: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every scenario of tests/support/constrained_scenarios.py on ONE real engine: vLLM's
    `LLM` in a script that imports Podium at the top (tests/support/constrained_llm.py),
    for test_engine.py and test_import.py; usually started at the session's first test
    (tests/support/constrained_run.py). Tests using it carry the `engine` mark."""
    from tests.support import constrained_run as run

    return run.result(run.start(smol_dir, tmp_path_factory.mktemp("constrained"),
                                constraint_cache))
