"""Importing Podium's constraints must not load numba: vLLM 0.32's CPU worker crashes at
start-up when llvmlite is already imported (``_rebind_kernels`` in
``vllm/triton_utils/dispatcher.py`` calls ``vars(x).get`` on every module attribute, and
llvmlite's ``ffi.lib``, a slotted proxy, answers ``__dict__`` with a ``_lib_fn_wrapper``). A
worker is spawned, so it re-imports the user's script, and it unpickles an engine config naming
the processor class, both before that scan: the first test pins what both need, the second runs
a constrained request on a real engine, from such a script."""

from __future__ import annotations

import pytest

from tests.support.constrained_scenarios import COLOURS
from tests.support.subproc import run_python


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
@pytest.mark.timeout(1800)  # the first test on the shared run waits for it
def test_a_script_importing_podium_at_the_top_runs_a_constrained_request(
        constrained_run: dict) -> None:
    """The script a user writes against vLLM's ``LLM`` (tests/support/constrained_llm.py, run
    as a file): Podium imported at module level, so the spawned engine processes import it
    too before the worker starts; the spec passed alone in the xargs, as such a script does.
    The same run serves test_engine.py (one engine start)."""
    result = constrained_run["colours"]
    assert "error" not in result, result.get("error")
    answers = [o["text"] for o in result["outputs"]]
    assert len(answers) == 4 and set(answers) <= set(COLOURS), answers
