"""`podium serve` checks its environment's settings before it boots anything: a bad value is
one line and exit 2, not a 500 at the first request that reads it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.harness import start_instance
from tests.support.spare import Spare

# the good boot is the suite's spare instance (its LLM under the thread compiler): no engine of
# its own; the bad one exits before any engine starts
pytestmark = pytest.mark.engine


def test_a_bad_constraint_compiler_setting_fails_the_boot_then_a_good_one_serves(
        tmp_path: Path, examples_dir: Path, spare_instance: Spare) -> None:
    bad = start_instance(["--repository", str(examples_dir)], tmp_path / "bad.log",
                         env={"PODIUM_CONSTRAINT_COMPILER": "gpu"})
    try:
        assert bad.process.wait(120) == 2
    finally:
        bad.stop()
    log = bad.log().strip()
    assert log == "podium: error: PODIUM_CONSTRAINT_COMPILER='gpu': use process or thread", log
    good = spare_instance.get()
    environ = Path(f"/proc/{good.process.pid}/environ").read_bytes().split(b"\0")
    assert b"PODIUM_CONSTRAINT_COMPILER=thread" in environ
    assert httpx.get(f"{good.http_url}/v2/health/ready", timeout=30).status_code == 200
