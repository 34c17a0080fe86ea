"""Preparing a ``choice`` constraint for a new request: Podium's trie vs vLLM's xgrammar path.

For each catalog size, one run measures, on the default model's tokenizer:

- Podium: ``ConstraintCompiler.compile`` of a ``choice`` spec, cold (a catalog it has not seen,
  so the token trie is built) and cached (the same catalog again, as the next request with it);
- vLLM: what its ``structured_outputs`` ``choice`` does on first use with the xgrammar backend:
  the choices become an EBNF grammar (``choice_as_grammar``) and xgrammar compiles it
  (``GrammarCompiler`` as vLLM builds it, 8 threads, cache on), cold and cached.

Cold figures are medians over ``--runs`` distinct catalogs of the same size.

    HF_HUB_OFFLINE=1 python -m bench.constraints_prepare [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from tests.support.catalog import make_titles

from podium.package.defaults import default_model_dir


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _catalogs(size: int, runs: int) -> list[list[str]]:
    """``runs`` catalogs of ``size`` titles that differ from each other (no cache hits)."""
    base = make_titles(size)
    return [[f"{t} ({run})" if run else t for t in base] for run in range(runs)]


def podium(model: str, catalogs: list[list[str]]) -> tuple[list[float], float]:
    from podium.constraints import TokenizerInfo
    from podium.constraints.compile.compiler import ConstraintCompiler

    compiler = ConstraintCompiler(TokenizerInfo.from_pretrained(model))
    compiler.compile({"type": "choice", "choices": ["warm", "up"]})  # imports, first call
    cold = [_timed(lambda c=c: compiler.compile({"type": "choice", "choices": c}))
            for c in catalogs]
    cached = _timed(lambda: compiler.compile({"type": "choice", "choices": catalogs[0]}))
    return cold, cached


def xgrammar(model: str, catalogs: list[list[str]]) -> tuple[list[float], float]:
    import xgrammar as xgr
    from transformers import AutoTokenizer
    from vllm.v1.structured_output.utils import choice_as_grammar

    tok = AutoTokenizer.from_pretrained(model)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok), max_threads=8,
                                   cache_enabled=True)
    compiler.compile_grammar(choice_as_grammar(["warm", "up"]))
    cold = [_timed(lambda c=c: compiler.compile_grammar(choice_as_grammar(c)))
            for c in catalogs]
    cached = _timed(lambda: compiler.compile_grammar(choice_as_grammar(catalogs[0])))
    return cold, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("PODIUM_TEST_MODEL_DIR"),
                    help="HF folder of the model (default: the default model, from the cache)")
    ap.add_argument("--sizes", default="10000,100000", help="catalog sizes, comma-separated")
    ap.add_argument("--runs", type=int, default=5, help="distinct catalogs per size (Podium)")
    ap.add_argument("--xgrammar-runs", type=int, default=2,
                    help="distinct catalogs per size for xgrammar (each takes seconds; 0 skips "
                         "it: at 100,000 choices one compile ran over 14 minutes here)")
    args = ap.parse_args()
    model = args.model or str(default_model_dir())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"{os.cpu_count()} CPUs; seconds to prepare a choice constraint")
    print(f"{'choices':>8}  {'podium cold':>22}  {'cached':>8}  {'xgrammar cold':>22}  "
          f"{'cached':>8}  {'ratio':>6}")
    for size in map(int, args.sizes.split(",")):
        catalogs = _catalogs(size, max(args.runs, args.xgrammar_runs))
        p_cold, p_cached = podium(model, catalogs[: args.runs])
        pm = statistics.median(p_cold)
        line = f"{size:>8}  {pm:>8.3f} (max {max(p_cold):6.3f})  {p_cached:>8.4f}  "
        if args.xgrammar_runs > 0:
            x_cold, x_cached = xgrammar(model, catalogs[: args.xgrammar_runs])
            xm = statistics.median(x_cold)
            line += (f"{xm:>8.3f} (max {max(x_cold):6.3f})  {x_cached:>8.4f}  "
                     f"{xm / pm:>5.1f}x")
        print(line, flush=True)


if __name__ == "__main__":
    main()
