"""Run Python in a fresh interpreter: multiprocess mode is fixed at prometheus_client's import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
    """Run `code` in a new interpreter; it must print one JSON document last on stdout."""
    full_env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=Path(__file__).parent,  # children import `engine_child` from here
    )
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
