"""The session's one run of `tests/support/constrained_llm.py` (vLLM's `LLM` in a user's
script, through every constraint scenario), read by the `constrained_run` fixture
(tests/constraints/conftest.py) for test_engine.py and test_import.py.

Started in the background at the session's first test when the session has a test on it
(`tests/conftest.py`, `_early_engine_runs`), not when the first constraint test asks: the run is
one process, ~75 s, whose engine computes on one core, and a whole run's first tests wait
~110 s for the shared instance (its embedder compiled at announce, then its boot), which leave
the other core mostly idle; the two overlap instead of running one after the other. Its
output does not depend on when it runs (greedy or checked for validity only; preemption comes
from its fixed KV blocks). The script's engine threads are not pinned
(`VLLM_CPU_OMP_THREADS_BIND=nobind`): vLLM pins every engine's worker to the first core, where
the announce's and the shared instance's workers compute.

A session without such a test starts nothing; one that ends before reading the run kills it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.harness import ROOT

TIMEOUT_S = 1500


@dataclass
class Run:
    """The script running (or done), writing its report to `out`."""

    process: subprocess.Popen[bytes]
    out: Path
    log: Path

    def result(self) -> dict:
        """The report, once the script is done (it must exit 0)."""
        try:
            returncode = self.process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the constrained run took over {TIMEOUT_S} s: "
                                 f"{self._tail()}") from None
        assert returncode == 0, self._tail()
        return json.loads(self.out.read_text())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=60)

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


_run: Run | None = None


def dtype_for(model_dir: Path) -> str:
    """The dtype Podium's `precision: auto` serves the model at here (float32 on a CPU without
    bf16 instructions, where bf16 runs 5-6x slower)."""
    from podium.package.precision import resolve_auto

    resolved = resolve_auto(model_dir)
    return resolved.precision.dtype if resolved.precision else "auto"


def start(model_dir: Path, workdir: Path, constraint_cache: Path) -> Run:
    """The session's run: started now, or the one already started."""
    global _run
    if _run is not None:
        return _run
    out, log = workdir / "report.json", workdir / "script.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           # compiled constraints go to the session's directory, not the host's shared one
           "PODIUM_CONSTRAINT_CACHE": str(constraint_cache),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    with log.open("wb") as sink:
        # run as a file: the spawned engine processes re-import it
        process = subprocess.Popen([sys.executable, str(ROOT / "tests/support/constrained_llm.py"),
                                    str(model_dir), dtype_for(model_dir), str(out)],
                                   stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    _run = Run(process, out, log)
    return _run


def stop() -> None:
    """Kill the run if it is still going (the session ends)."""
    if _run is not None:
        _run.stop()
