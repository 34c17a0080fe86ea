"""Podium's benchmarks: one script per figure in docs/benchmarks.md, run from the repository
root as modules (`python -m bench.openai_overhead ...`), all on the one harness in
`bench/harness/` (serve-and-wait, load loops, percentiles, the ratio report)."""
