"""`podium examples create DIR`: a ready model repository for the tour.

Writes one package per backend — `xgb-example`, `torch-example`, `onnx-example`,
`python-example` (an ensemble calling xgb-example) — the default LLM
(`smollm2-135m-instruct`, manifest only) and `recommend`, a pipeline over xgb-example and the
LLM (docs/pipelines.md). `podium serve --repository DIR` serves them all.
"""

from __future__ import annotations

from pathlib import Path

from podium.examples.builders import (
    write_llm_example,
    write_onnx_example,
    write_python_example,
    write_torch_example,
    write_xgb_example,
)
from podium.examples.recommend import write_recommend_example

__all__ = ["create_examples"]


def create_examples(target: Path) -> list[Path]:
    """Write every example package under `target`; returns the package directories."""
    target = Path(target).expanduser()
    target.mkdir(parents=True, exist_ok=True)
    return [
        write_xgb_example(target / "xgb-example"),
        write_torch_example(target / "torch-example"),
        write_onnx_example(target / "onnx-example"),
        write_python_example(target / "python-example"),
        write_llm_example(target / "smollm2-135m-instruct"),
        write_recommend_example(target / "recommend", "smollm2-135m-instruct"),
    ]
