"""Importing Podium's constraints must not load numba: vLLM 0.32's CPU worker crashes at
start-up when llvmlite is already imported (``_rebind_kernels`` in
``vllm/triton_utils/dispatcher.py`` calls ``vars(x).get`` on every module attribute, and
llvmlite's ``ffi.lib``, a slotted proxy, answers ``__dict__`` with a ``_lib_fn_wrapper``). A
worker is spawned, so it re-imports the user's script, and it unpickles an engine config naming
the processor class, both before that scan: the first test pins what both need, the second runs
the first on a real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.subproc import run_python

CHOICES = ["red", "green", "blue"]


def test_importing_the_package_and_the_processor_loads_no_numba() -> None:
    loaded = run_python("""
        import json, sys
        import podium.constraints as c
        c.validate_constraint({"type": "choice", "choices": ["a"]})
        c.validate_constraint({"type": "regex", "pattern": "[0-9]+"})
        c.validate_constraint({"type": "distinct_items", "items": ["a", "b"]})
        import podium.constraints.processor  # the entry point's path: engine.processor
        print(json.dumps(sorted(m for m in ("numba", "llvmlite") if m in sys.modules)))
    """)
    assert loaded == []


@pytest.mark.engine
def test_a_script_importing_podium_at_the_top_runs_a_constrained_request(
        tmp_path: Path, smol_dir: Path, smol_dtype: str) -> None:
    """The script a user writes against vLLM's ``LLM``: Podium imported at module level, so
    the spawned engine processes import it too before the worker starts."""
    script = tmp_path / "constrained.py"
    script.write_text(textwrap.dedent(f"""
        import json
        from podium.constraints import engine_logits_processors, to_vllm_xargs
        from podium.constraints import validate_constraint
        from podium.constraints.engine.processor import ConstraintLogitsProcessor  # noqa: F401
        from vllm import LLM, SamplingParams

        if __name__ == "__main__":
            llm = LLM(model={str(smol_dir)!r}, logits_processors=engine_logits_processors(),
                      enforce_eager=True, max_model_len=512, seed=0, dtype={smol_dtype!r})
            spec = validate_constraint({{"type": "choice", "choices": {CHOICES!r}}})
            params = SamplingParams(temperature=1.0, max_tokens=8,
                                    extra_args=to_vllm_xargs(spec))
            out = llm.chat([[{{"role": "user", "content": "Name a colour."}}]] * 4,
                           sampling_params=params, use_tqdm=False)
            print("ANSWERS", json.dumps([o.outputs[0].text for o in out]), flush=True)
    """))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    # run as a file: the spawned engine processes re-import it
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    [line] = [x for x in out.splitlines() if x.startswith("ANSWERS ")]  # vLLM logs here too
    answers = json.loads(line.removeprefix("ANSWERS "))
    assert len(answers) == 4 and set(answers) <= set(CHOICES), answers
