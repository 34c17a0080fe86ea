"""Entry points: user-defined constraint types, and vLLM finding the processor.

A throwaway distribution (a ``.dist-info`` folder on ``sys.path``) declares both groups, so
these tests exercise the same ``importlib.metadata`` lookup an installed package gets.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from podium.constraints import (
    PROCESSOR_FQCN,
    engine_logits_processors,
    load_constraint_plugins,
    validate_constraint,
)
from podium.constraints.compile.compiler import ConstraintCompiler
from podium.constraints.compile.vocab import TokenizerInfo
from podium.constraints.engine.processor import ConstraintLogitsProcessor
from podium.constraints.spec.registry import constraint_type
from podium.errors import InvalidArgument
from tests.support.walk import Walker

PLUGIN = '''
"""A user-defined constraint: exactly `length` tokens, each from `ids`."""
from podium.constraints import ConstraintType, TableConstraint, TokenTable


def validate(spec):
    ids, length = spec.get("ids"), spec.get("length")
    if not ids or not all(isinstance(i, int) for i in ids):
        raise ValueError("ids must be a non-empty list of token ids", "ids")
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length={length!r} must be a positive integer", "length")
    return {"type": "token_run", "ids": sorted(set(ids)), "length": length}


def compile(spec, tok):
    # state k = k tokens emitted so far; state `length` accepts
    edges = [(k, t, k + 1) for k in range(spec["length"]) for t in spec["ids"]]
    table = TokenTable.from_edges(spec["length"] + 1, edges, [spec["length"]], 0,
                                  tok.vocab_size)
    return TableConstraint(table)


TOKEN_RUN = ConstraintType("token_run", validate, compile)
'''


@pytest.fixture()
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "podium_demo_plugin.py").write_text(PLUGIN)
    info = tmp_path / "podium_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: podium-demo-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""
        [podium.constraints]
        token_run = podium_demo_plugin:TOKEN_RUN

        [vllm.logits_processors]
        podium_constraints = podium.constraints.processor:ConstraintLogitsProcessor
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("podium_demo_plugin", None)  # another test may have imported its own
    yield tmp_path
    sys.modules.pop("podium_demo_plugin", None)


def test_user_defined_constraint_from_an_entry_point(installed_plugin: Path,
                                                     tok: TokenizerInfo) -> None:
    assert "token_run" in load_constraint_plugins()
    with pytest.raises(InvalidArgument) as e:
        validate_constraint({"type": "token_run", "ids": [5], "length": 0})
    assert e.value.param == "constraint.length"
    spec = validate_constraint({"type": "token_run", "ids": [40, 41, 40], "length": 3})
    c = ConstraintCompiler(tok).compile(spec)
    w = Walker(c, tok.eos_token_ids)
    assert w.allowed() == {40, 41}
    assert w.accepts([41, 40, 40])
    assert not Walker(c, tok.eos_token_ids).accepts([41, 40])
    assert constraint_type("token_run") is not None


def test_without_the_entry_point_the_engine_gets_the_fqcn() -> None:
    from importlib.metadata import entry_points

    if any(PROCESSOR_FQCN in ep.value for ep in entry_points(group="vllm.logits_processors")):
        assert engine_logits_processors() == []  # podium itself is installed with it
    else:
        assert engine_logits_processors() == [PROCESSOR_FQCN]


def test_vllm_loads_the_processor_from_the_entry_point_on_both_runners(
        installed_plugin: Path) -> None:
    from vllm.v1.sample.logits_processor import _load_logitsprocs_plugins
    from vllm.v1.worker.gpu.sample.logits_processor.loader import (
        _load_v2_logitsprocs_plugins,
    )

    # V1 (CPU) takes any class; V2 (NVIDIA) rejects classes lacking its interface
    assert ConstraintLogitsProcessor in _load_logitsprocs_plugins()
    assert ConstraintLogitsProcessor in _load_v2_logitsprocs_plugins()
    # installed as a plugin, it must not also be passed to the engine (it would run twice)
    assert engine_logits_processors() == []
