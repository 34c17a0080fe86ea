"""The built-in constraint types are there whatever plugins do, and cannot be taken over."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PLUGIN = '''
from podium.constraints import ConstraintType

CHOICE = ConstraintType("choice", lambda spec: {"type": "choice", "hijacked": True},
                        lambda spec, tok: None)
'''


def _run(script: str, plugin_dir: Path) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter (a registry nothing has touched yet)."""
    env_path = f"{plugin_dir}:{REPO / 'src'}"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": env_path}, check=False)


@pytest.fixture
def choice_plugin(tmp_path: Path) -> Path:
    """A distribution whose `podium.constraints` entry point registers `choice`."""
    (tmp_path / "podium_choice_plugin.py").write_text(PLUGIN)
    info = tmp_path / "podium_choice_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: podium-choice-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[podium.constraints]\nchoice = podium_choice_plugin:CHOICE\n")
    return tmp_path


def test_a_plugin_taking_a_built_in_name_is_refused_naming_it(choice_plugin: Path) -> None:
    result = _run("""
        from podium.constraints import load_constraint_plugins
        load_constraint_plugins()
    """, choice_plugin)
    assert result.returncode != 0
    assert "podium_choice_plugin:CHOICE" in result.stderr
    assert "'choice' is built in" in result.stderr


def test_built_ins_load_even_when_a_plugin_registers_first(choice_plugin: Path) -> None:
    result = _run("""
        from podium.constraints import register_constraint_type, validate_constraint
        from podium.constraints.spec.registry import constraint_type_names
        import podium_choice_plugin
        try:
            register_constraint_type(podium_choice_plugin.CHOICE)  # before anything else
        except ValueError as exc:
            print("refused:", exc)
        print(constraint_type_names())
        print(validate_constraint({"type": "choice", "choices": ["a", "b"]}))
        print(validate_constraint({"type": "regex", "pattern": "[0-9]+"}))
    """, choice_plugin)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("refused: constraint type 'choice' is built in")
    assert lines[1] == "['choice', 'distinct_items', 'regex']"
    assert lines[2] == "{'type': 'choice', 'choices': ['a', 'b']}"
    assert "[0-9]+" in lines[3]


def test_registering_a_new_name_works_and_twice_is_refused() -> None:
    from podium.constraints import ConstraintType, register_constraint_type
    from podium.constraints.spec.registry import _TYPES, constraint_type

    ct = ConstraintType("test_only_digits", lambda s: s, lambda s, t: None)
    try:
        register_constraint_type(ct)
        assert constraint_type("test_only_digits") is ct
        register_constraint_type(ct)  # the same object again (a reload) is harmless
        with pytest.raises(ValueError, match="already registered"):
            register_constraint_type(ConstraintType("test_only_digits", ct.validate, ct.compile))
    finally:
        _TYPES.pop("test_only_digits", None)
