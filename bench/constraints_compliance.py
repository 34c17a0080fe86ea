"""Compliance vs generate-then-validate: ``distinct_items`` on the engine, side by side.

Each request asks for ``--k`` different titles from the member's own candidate set (``--candidates``
titles, listed in the prompt, different for every request), as a JSON array. One vLLM engine
(SmolLM2, Podium's processor installed) answers the same requests three ways at temperature 1.0:

- ``podium distinct_items``: the constraint inside the decoding loop, one attempt;
- ``unconstrained + retry``: free generation, validated, invalid answers asked again (up to
  ``--attempts`` attempts in all);
- ``vllm json_schema + retry``: vLLM's own ``structured_outputs`` with a JSON schema (array of
  the candidates as an enum, exactly k items); a schema cannot say "no repeats" compactly,
  so repeated titles are caught by the same validation and retried.

An answer is valid when it parses as a JSON array of exactly k distinct candidate titles.
Reported per mode: share valid after the first attempt and after all attempts, generated and
prompt tokens spent per valid answer (retries re-send the prompt), and wall time.

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 python -m bench.constraints_compliance
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.catalog import make_titles

from podium.package.defaults import default_model_dir


@dataclass
class Tally:
    """What one mode spent and got."""

    valid_first: int = 0
    valid: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    attempts: int = 0
    seconds: float = 0.0
    sample_invalid: list[str] = field(default_factory=list)


def is_valid(text: str, candidates: list[str], k: int) -> bool:
    """A JSON array (the first one in the text) of exactly k distinct candidate titles."""
    start = text.find("[")
    if start < 0:
        return False
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return False
    return (isinstance(value, list) and len(value) == k
            and all(isinstance(v, str) and v in candidates for v in value)
            and len(set(value)) == k)


def _prompt(candidates: list[str], k: int) -> list[dict[str, str]]:
    listing = "\n".join(f"- {c}" for c in candidates)
    return [{"role": "user", "content":
             f"Recommend {k} different movies from this list for tonight:\n{listing}\n"
             f"Answer only with a JSON array of {k} titles, exactly as written above."}]


def run_mode(llm: Any, make_params: Any, requests: list[list[str]], k: int,
             attempts: int) -> Tally:
    tally = Tally()
    pending = list(range(len(requests)))
    t0 = time.perf_counter()
    for attempt in range(attempts):
        if not pending:
            break
        prompts = [_prompt(requests[i], k) for i in pending]
        params = [make_params(requests[i]) for i in pending]
        outs = llm.chat(prompts, sampling_params=params, use_tqdm=False)
        still = []
        for i, out in zip(pending, outs, strict=True):
            tally.attempts += 1
            tally.prompt_tokens += len(out.prompt_token_ids)
            tally.generated_tokens += len(out.outputs[0].token_ids)
            if is_valid(out.outputs[0].text, requests[i], k):
                tally.valid += 1
                tally.valid_first += attempt == 0
            else:
                still.append(i)
                if len(tally.sample_invalid) < 2:
                    tally.sample_invalid.append(out.outputs[0].text[:160])
        pending = still
    tally.seconds = time.perf_counter() - t0
    return tally


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("PODIUM_TEST_MODEL_DIR"),
                    help="HF folder of the model (default: the default model, from the cache)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--candidates", type=int, default=30, help="titles per member")
    ap.add_argument("--k", type=int, default=5, help="titles to pick")
    ap.add_argument("--attempts", type=int, default=5, help="attempts per request when retrying")
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    args.model = args.model or str(default_model_dir())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from podium.constraints import engine_logits_processors, to_vllm_xargs, validate_constraint

    rng = random.Random(0)
    catalog = make_titles(5_000)
    requests = [rng.sample(catalog, args.candidates) for _ in range(args.requests)]
    llm = LLM(model=args.model, logits_processors=engine_logits_processors(), enforce_eager=True,
              max_num_seqs=32, max_model_len=2048, seed=0)
    base = {"temperature": 1.0, "max_tokens": args.max_tokens}

    def podium(cands: list[str]) -> Any:
        spec = {"type": "distinct_items", "items": cands, "min": args.k, "max": args.k}
        return SamplingParams(**base, extra_args=to_vllm_xargs(validate_constraint(spec)))

    def free(_cands: list[str]) -> Any:
        return SamplingParams(**base)

    def schema(cands: list[str]) -> Any:
        js = {"type": "array", "items": {"type": "string", "enum": cands},
              "minItems": args.k, "maxItems": args.k}
        return SamplingParams(**base, structured_outputs=StructuredOutputsParams(json=js))

    modes = {"podium distinct_items": (podium, 1), "unconstrained + retry": (free, args.attempts),
             "vllm json_schema + retry": (schema, args.attempts)}
    print(f"{args.requests} requests: {args.k} distinct of {args.candidates} candidates each, "
          f"temperature 1.0, up to {args.attempts} attempts when retrying")
    print(f"{'mode':<26}{'valid 1st':>10}{'valid':>8}{'attempts':>9}{'gen tok/valid':>14}"
          f"{'prompt tok/valid':>17}{'s/valid':>9}")
    for name, (make, attempts) in modes.items():
        run_mode(llm, make, requests[:2], args.k, 1)  # warm-up (vLLM compiles its grammar)
        t = run_mode(llm, make, requests, args.k, attempts)
        if t.valid:
            spent = (f"{t.generated_tokens / t.valid:>14.1f}{t.prompt_tokens / t.valid:>17.1f}"
                     f"{t.seconds / t.valid:>9.3f}")
        else:  # nothing valid: report what was spent in all
            spent = (f"  none valid: {t.generated_tokens} generated, {t.prompt_tokens} prompt "
                     f"tokens, {t.seconds:.1f} s")
        print(f"{name:<26}{t.valid_first / args.requests:>10.1%}{t.valid / args.requests:>8.1%}"
              f"{t.attempts:>9d}{spent}", flush=True)
        for text in t.sample_invalid:
            print(f"    e.g. invalid: {text!r}")
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
