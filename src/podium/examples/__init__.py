"""`podium examples create DIR`: a ready model repository for the tour.

Writes one package per backend — `xgb-example`, `torch-example`, `onnx-example`,
`python-example` (an ensemble calling xgb-example) — the default LLM
(`smollm2-135m-instruct`, manifest only, LoRA on), `recommend`, a pipeline over xgb-example
and the LLM (docs/pipelines.md), and with `with_adapter` the LLM's LoRA adapter `support-tone`
(trained on the spot by `lora_tone`). `podium serve --repository DIR` serves them all.
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


def create_examples(target: Path, *, with_adapter: bool = False) -> list[Path]:
    """Write every example package under `target`; returns the package directories.
    `with_adapter` (what `podium examples create` does) also trains the LoRA adapter
    `support-tone` for the LLM (`examples.lora_tone`: PEFT, tens of seconds of CPU)."""
    target = Path(target).expanduser()
    target.mkdir(parents=True, exist_ok=True)
    written = [
        write_xgb_example(target / "xgb-example"),
        write_torch_example(target / "torch-example"),
        write_onnx_example(target / "onnx-example"),
        write_python_example(target / "python-example"),
        write_llm_example(target / "smollm2-135m-instruct"),
        write_recommend_example(target / "recommend", "smollm2-135m-instruct"),
    ]
    if with_adapter:
        from podium.examples.lora_tone import NAME, write_adapter_example
        from podium.package.defaults import DEFAULT_MODEL

        written.append(write_adapter_example(target / NAME, f"{DEFAULT_MODEL}@1"))
    return written
