"""`python tests/support/constrained_llm.py MODEL_DIR DTYPE OUT.json`: vLLM's `LLM` with
Podium's constraint processors, in a script as a user writes it (Podium imported at module
level, so the engine processes vLLM spawns import it too, re-importing this file, before the
worker starts), through every scenario of `tests/support/constrained_scenarios.py` on one
engine. Writes, per scenario, each request's output (text, finish reason, token ids) and
prompt length, and vLLM's preemption count before and after; a scenario that raises writes
its traceback and the others still run. Needs the repository root on PYTHONPATH.
"""

# Podium first, as the user's script this stands for imports it (before vLLM)
import json  # noqa: I001
import sys
import traceback
from typing import Any

from podium.constraints import (
    KEY_XARGS,
    engine_logits_processors,
    to_vllm_xargs,
    validate_constraint,
)
from podium.constraints.engine.processor import ConstraintLogitsProcessor  # noqa: F401
from tests.support import constrained_scenarios as sc
from vllm import LLM, SamplingParams

VOCAB = 49152  # the default model's


def _params(precompiler: Any, spec: dict[str, Any], budget: int, temperature: float,
            precompiled: bool) -> SamplingParams:
    normalized = validate_constraint(spec)
    xargs = to_vllm_xargs(normalized)
    if precompiled:  # what admission hands the engine: the spec compiled, its form's key
        xargs = {**xargs, KEY_XARGS: precompiler.compile_now(normalized).key}
    # no per-request seed: on CPU, vLLM 0.32 crashes the engine when a seeded request is
    # prefilled in chunks ("CPU Generator does not use offset" in _bookkeeping_sync)
    return SamplingParams(temperature=temperature, max_tokens=budget, extra_args=xargs)


def _preemptions(llm: LLM) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


def _outputs(results: list[Any]) -> list[dict[str, Any]]:
    return [{"text": r.outputs[0].text, "finish_reason": r.outputs[0].finish_reason,
             "token_ids": list(r.outputs[0].token_ids), "prompt_len": len(r.prompt_token_ids)}
            for r in results]


def _chat(llm: LLM, prompts: list[str], params: list[SamplingParams]) -> list[Any]:
    return llm.chat([[{"role": "user", "content": p}] for p in prompts],
                    sampling_params=params, use_tqdm=False)


def _run(llm: LLM, precompiler: Any, scenario: sc.Scenario) -> dict[str, Any]:
    params = [_params(precompiler, spec, budget, scenario.temperature, scenario.precompiled)
              for spec, budget in zip(scenario.specs, scenario.budgets, strict=True)]
    before = _preemptions(llm)
    outputs = _outputs(_chat(llm, scenario.prompts, params))
    return {"outputs": outputs, "preempted": _preemptions(llm) - before}


def _mixed(llm: LLM, precompiler: Any) -> dict[str, Any]:
    free = SamplingParams(temperature=0.0, max_tokens=12)
    constrained = _params(precompiler, {"type": "choice", "choices": ["yes", "no"]}, 12, 0.0,
                          True)
    both = _outputs(_chat(llm, [sc.MIXED_PROMPT] * 2, [free, constrained]))
    alone = _outputs(_chat(llm, [sc.MIXED_PROMPT], [free]))
    return {"outputs": both, "alone": alone, "preempted": 0}


def main(model_dir: str, dtype: str, out_path: str) -> None:
    from podium.constraints.compile.precompile import ConstraintPrecompiler

    llm = LLM(model=model_dir, dtype=dtype, logits_processors=engine_logits_processors(),
              **sc.ENGINE_ARGS)
    precompiler = ConstraintPrecompiler(model_dir, VOCAB)  # after the engine started
    report: dict[str, Any] = {}
    runs = {name: (lambda s=s: _run(llm, precompiler, s)) for name, s in sc.scenarios().items()}
    runs["mixed"] = lambda: _mixed(llm, precompiler)
    for name, run in runs.items():
        try:
            report[name] = run()
        except Exception:  # the next scenarios still run; the test of this one shows why
            report[name] = {"error": traceback.format_exc()}
        print(f"scenario {name} done", flush=True)
    with open(out_path, "w") as out:
        json.dump(report, out)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
