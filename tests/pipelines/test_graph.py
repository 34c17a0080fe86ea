"""A pipeline's graph is checked at load: each bad graph is refused naming the step."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.errors import PackageError
from tests.support.pipelines import build

EXPERIMENT = {"name": "arm", "kind": "experiment", "key": "$input.member_id", "salt": "s",
              "variants": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}]}


def _py(name: str, **args: object) -> dict[str, object]:
    return {"name": name, "kind": "python", "function": "fns.py:echo", "args": args}


BAD = [
    pytest.param([{"name": "x", "kind": "magic"}], "step 'x': kind='magic' is unknown",
                 id="unknown-kind"),
    pytest.param([_py("x", v="$nowhere.items")], "step 'x': `$nowhere` names no step",
                 id="missing-step-input"),
    pytest.param([_py("x", v="$input.country")], "`$input.country` is not a declared input",
                 id="missing-request-input"),
    pytest.param([_py("a", v="$b"), _py("b", v="$c"), _py("c", v="$a")],
                 "form a cycle", id="cycle"),
    pytest.param([_py("a", v="$a")], "step 'a' reads its own result", id="self-loop"),
    pytest.param([{"name": "m", "kind": "model", "model": "nope", "inputs": {"x": 1}}],
                 "step 'm': model 'nope' does not exist in this instance", id="unknown-model"),
    pytest.param([{"name": "m", "kind": "model", "model": "scorer@9", "inputs": {"x": 1}}],
                 "step 'm': model 'scorer@9' does not exist", id="unknown-version"),
    pytest.param([{"name": "m", "kind": "model", "model": "scorer"}],
                 "step 'm' (model): give either `inputs`", id="model-without-inputs"),
    pytest.param([EXPERIMENT, {**_py("x"), "when_variant": ["c"]}],
                 "step 'x': when_variant names ['c']", id="unknown-variant"),
    pytest.param([{**_py("x"), "when_variant": ["a"]}], "when_variant needs an experiment",
                 id="gate-without-experiment"),
    pytest.param([_py("x"), _py("x")], "step 'x': the name is used twice", id="duplicate"),
    pytest.param([{**_py("x"), "after": ["y"]}], "step 'x': after='y' names no step",
                 id="after-unknown"),
    pytest.param([{**_py("x"), "timeout_ms": 0}], "step 'x' (python): timeout_ms",
                 id="bad-timeout"),
    pytest.param([{"name": "f", "kind": "python", "function": "fns.py:absent"}],
                 "step 'f' (python): ", id="missing-function"),
    pytest.param([{"name": "f", "kind": "features", "keys": "$input.member_id",
                   "columns": ["a"], "source": {"type": "redis"}}],
                 "step 'f' (features): source type 'redis' is unknown", id="unknown-source"),
    pytest.param([{"name": "input", "kind": "python", "function": "fns.py:echo"}],
                 "`input` is reserved", id="reserved-name"),
]


@pytest.mark.parametrize(("steps", "message"), BAD)
def test_a_bad_graph_is_refused_at_load_naming_the_step(tmp_path: Path, models, steps,
                                                        message: str) -> None:
    (tmp_path / "fns.py").write_text("def echo(**kw):\n    return kw\n")
    with pytest.raises(PackageError) as caught:
        build(tmp_path, models, steps)
    assert message in caught.value.message


def test_an_output_reading_no_step_is_refused(tmp_path: Path, models) -> None:
    (tmp_path / "fns.py").write_text("def echo(**kw):\n    return kw\n")
    with pytest.raises(PackageError, match="output 'out': `\\$ghost` names no step"):
        build(tmp_path, models, [_py("x")], outputs=[
            {"name": "out", "datatype": "BYTES", "shape": [1], "from": "$ghost.v"}])


def test_a_good_graph_orders_steps_after_what_they_read(tmp_path: Path, models) -> None:
    (tmp_path / "fns.py").write_text("def echo(**kw):\n    return kw\n")
    pipeline = build(tmp_path, models, [_py("c", v="$b.v"), _py("b", v="$a"), EXPERIMENT,
                                        {**_py("a"), "when_variant": ["a"]}])
    order = list(pipeline.graph.steps)
    assert order.index("a") < order.index("b") < order.index("c")
    assert order.index("arm") < order.index("a")  # a gated step waits for its experiment
