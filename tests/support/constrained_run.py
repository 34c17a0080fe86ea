"""The session's one run of `tests/support/constrained_llm.py` (vLLM's `LLM` in a user's
script, through every constraint scenario), read by the `constrained_run` fixture
(tests/constraints/conftest.py) for test_engine.py and test_import.py.

A background job (tests/support/background.py): started at the session's first test when the
session has a test on it (`tests/conftest.py`), not when the first constraint test asks. The run
is one process, ~75 s, whose engine computes on one core; a whole run's first tests wait ~120 s
for the shared instance (its embedder compiled at announce, then its boot), which leave the
other core partly idle. Its output does not depend on when it runs (greedy or checked for
validity only; preemption comes from its fixed KV blocks). The script's engine threads are
not pinned (`VLLM_CPU_OMP_THREADS_BIND=nobind`): vLLM pins every engine's worker to the first
core, where the announce's and the shared instance's workers compute.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.support import background
from tests.support.harness import ROOT

NAME = "constrained_run"


def dtype_for(model_dir: Path) -> str:
    """The dtype Podium's `precision: auto` serves the model at here (float32 on a CPU without
    bf16 instructions, where bf16 runs 5-6x slower)."""
    from podium.package.precision import resolve_auto

    resolved = resolve_auto(model_dir)
    return resolved.precision.dtype if resolved.precision else "auto"


def start(model_dir: Path, workdir: Path, constraint_cache: Path) -> background.Job:
    """The session's run: started now, or the one already started."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           # compiled constraints go to the session's directory, not the host's shared one
           "PODIUM_CONSTRAINT_CACHE": str(constraint_cache),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    # run as a file: the spawned engine processes re-import it
    return background.start(NAME, [sys.executable, str(ROOT / "tests/support/constrained_llm.py"),
                                   str(model_dir), dtype_for(model_dir),
                                   str(workdir / "report.json")], workdir, env)


def result(job: background.Job) -> dict:
    """The run's report, once the script is done (it must exit 0)."""
    job.stdout()
    return json.loads((job.out.parent / "report.json").read_text())
