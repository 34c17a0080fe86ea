"""The test PostgreSQL server's URL: PODIUM_TEST_POSTGRES_URL, or the server started with
scripts/postgres.sh (never a skip). tests/control's `postgres_url` fixture and the tests
outside it read it here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def postgres_url() -> str:
    url = os.environ.get("PODIUM_TEST_POSTGRES_URL")
    if url:
        return url
    result = subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh")], capture_output=True,
                            text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.fail(f"scripts/postgres.sh failed ({result.returncode}):\n{result.stderr[-3000:]}")
    url = result.stdout.strip().splitlines()[-1].split("=", 1)[1]
    os.environ["PODIUM_TEST_POSTGRES_URL"] = url
    return url
