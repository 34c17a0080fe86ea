"""Model Runner V2 with vLLM's own Triton kernels rather than their writes played by hand.

`bench/gpu_v2_check.py` drives the processor through the V2 runner's real pieces (its
``RequestState`` and staged writes, its loader, ``prepare_inputs``' kernels, the sampler's
``LogitsContext``, ``get_num_sampled_and_rejected`` and ``post_update``) over chunked prefill,
preemption and re-prefill in another slot, recycled slots, shuffled rows and 0-3 draft tokens
per request, checking every row against a from-scratch replay and the device history against
the host's. It ran on an NVIDIA H200 (docs/constraints.md); here the same kernels run in
Triton's interpreter on CPU tensors, in a subprocess because the interpreter must be chosen
before Triton is imported (and vLLM's CPU build disables Triton at import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_v2_runner_kernels_commit_what_the_processor_masked(tmp_path: Path,
                                                            smol_dir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               HF_HUB_OFFLINE="1", PODIUM_CONSTRAINT_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_v2_check", "--cpu", "--skip", "bench",
         "--model", str(smol_dir), "--check-steps", "30", "--check-slots", "8",
         "--check-live", "6", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stats = json.loads((tmp_path / "gpu_v2_check.json").read_text())["check"]
    # every row was checked, and the walk covered what it is for (the script asserts each)
    assert stats["constrained_rows"] > 100 and stats["draft_rows"] > 0, stats
    assert stats["refill_rows"] > 0 and stats["resumed"] > 0 and stats["finished"] > 0, stats
    assert stats["engine_compiles"] == 0, stats  # every form came from admission's store
