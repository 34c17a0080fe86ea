"""`podium serve` checks its environment's settings before it boots anything: a bad value is
one line and exit 2, not a 500 at the first request that reads it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.harness import running_instance, start_instance

# the good boot serves the examples, their LLM too: a real engine under the thread compiler
pytestmark = pytest.mark.engine


def test_a_bad_constraint_compiler_setting_fails_the_boot_then_a_good_one_serves(
        tmp_path: Path, examples_dir: Path) -> None:
    bad = start_instance(["--repository", str(examples_dir)], tmp_path / "bad.log",
                         env={"PODIUM_CONSTRAINT_COMPILER": "gpu"})
    try:
        assert bad.process.wait(120) == 2
    finally:
        bad.stop()
    log = bad.log().strip()
    assert log == "podium: error: PODIUM_CONSTRAINT_COMPILER='gpu': use process or thread", log
    with running_instance(["--repository", str(examples_dir)], tmp_path / "good.log",
                          env={"PODIUM_CONSTRAINT_COMPILER": "thread"}) as good:
        assert httpx.get(f"{good.http_url}/v2/health/ready", timeout=30).status_code == 200
