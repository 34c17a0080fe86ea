"""vLLM's own serving benchmark (`vllm.benchmarks.serve`) as the LLM benches' load: the same
client, dataset and TTFT/ITL definitions as the numbers vLLM publishes. Imported lazily: it
pulls in vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.harness.loops import check_loopback


def serving_benchmark(base_url: str, model: str, tokenizer: Path, num_prompts: int,
                      concurrency: int, *, dataset: Path | None = None, warmups: int = 4,
                      ready_check: bool = True, input_len: int = 128, output_len: int = 64,
                      models: list[str] | None = None) -> dict[str, Any]:
    """One run of vLLM's serving benchmark against `base_url`, streaming `/v1/completions`
    with `ignore_eos`, seed 0: random `input_len` in / `output_len` out (128 / 64), or the
    prompts of a custom JSONL `dataset` (`output_len` out each). `models` spreads the requests
    round-robin over those model names (vLLM's `--lora-modules`; the base may be one of them).
    `ready_check=False` skips its test request (so a run sends exactly `num_prompts +
    warmups`). Returns vLLM's result dict."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    check_loopback(base_url)
    if dataset is not None:
        _read_jsonl_without_pandas()
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    data = (["--dataset-name", "random", "--input-len", str(input_len), "--output-len",
             str(output_len)]
            if dataset is None else
            ["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len",
             str(output_len), "--skip-chat-template"])
    if models:
        data += ["--lora-modules", *models, "--lora-assignment", "round-robin"]
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", str(tokenizer), *data, "--num-prompts",
        str(num_prompts), "--max-concurrency", str(concurrency), "--ignore-eos",
        "--disable-tqdm", "--seed", "0", "--num-warmups", str(warmups),
        *([] if ready_check else ["--ready-check-timeout-sec", "0"])])
    return main(args)


class _JsonLines:
    """The little of pandas that vLLM's custom dataset reads a JSONL file with (`read_json`,
    `.columns`, `.iterrows()`, `row.to_dict()`): pandas is not a dependency of Podium."""

    class Row(dict):
        def to_dict(self) -> dict:
            return dict(self)

    def __init__(self, rows: list[dict]) -> None:
        self.rows = [self.Row(r) for r in rows]
        self.columns = {k for r in rows for k in r}

    def iterrows(self):  # type: ignore[no-untyped-def]
        return enumerate(self.rows)

    @classmethod
    def read_json(cls, path_or_buf: str, lines: bool = True) -> _JsonLines:
        assert lines
        text = Path(path_or_buf).read_text()
        return cls([json.loads(line) for line in text.splitlines() if line.strip()])


def _read_jsonl_without_pandas() -> None:
    import importlib.util

    if importlib.util.find_spec("pandas") is None:
        from vllm.benchmarks.datasets import datasets

        datasets.pd = _JsonLines  # type: ignore[attr-defined]
