"""The environment is read in one place, `podium.env`, and every variable Podium reads or sets
is tabled in docs/operations.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from podium import env

SOURCES = Path(__file__).resolve().parent.parent / "src" / "podium"
OPERATIONS = SOURCES.parent.parent / "docs" / "operations.md"
HANDSHAKES = {("engine_patches/lifecycle.py", "PODIUM_ENGINE_PARENT"),
              ("engine_patches/lifecycle.py", "PODIUM_ENGINE_PRELOADER"),
              ("preload/server.py", "PODIUM_ENGINE_PRELOADER")}
"""Not configuration: the server tells its own engine core process its pid."""
NOT_VARIABLES = {"PODIUM_OWNED"}
"""Names in the code that look like variables and are not (a dict of sampling fields)."""


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "literal" assignments."""
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _read_names(tree: ast.Module) -> list[ast.expr]:
    """The name arguments of os.environ.get/pop/[...], os.getenv and `in os.environ`."""
    names: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if (node.func.attr in ("get", "pop") and _is_environ(node.func.value)) or (
                    node.func.attr == "getenv"):
                names.append(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(
                node.ctx, ast.Load):
            names.append(node.slice)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            names.append(node.left)
    return names


def _reads(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    constants = _constants(tree)
    found = set()
    for name in _read_names(tree):
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            found.add(name.value)
        elif isinstance(name, ast.Name) and name.id in constants:
            found.add(constants[name.id])
    return found


def test_no_module_but_env_reads_a_podium_variable() -> None:
    offenders = sorted(
        f"{path.relative_to(SOURCES)} reads {name}"
        for path in SOURCES.rglob("*.py") if path.name != "env.py" or path.parent != SOURCES
        for name in _reads(path)
        if name.startswith("PODIUM_") and (str(path.relative_to(SOURCES)), name)
        not in HANDSHAKES)
    assert not offenders, ("read PODIUM_* variables through a function of podium/env.py (and "
                           "table them in docs/operations.md):\n" + "\n".join(offenders))


def test_the_scan_finds_a_read(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text('import os\nX = "PODIUM_X"\nos.environ.get(X)\nos.getenv("PODIUM_Y")\n'
                    'os.environ["PODIUM_Z"]\n"PODIUM_W" in os.environ\n')
    assert _reads(path) == {"PODIUM_X", "PODIUM_Y", "PODIUM_Z", "PODIUM_W"}


def test_every_variable_podium_names_is_tabled_in_operations_md() -> None:
    named = set()
    for path in SOURCES.rglob("*.py"):
        named |= set(re.findall(r"\b((?:PODIUM|HF|VLLM)_[A-Z_]+)\b", path.read_text()))
    section = OPERATIONS.read_text().split("## Environment variables")[1].split("\n## ")[0]
    tabled = {name for row in section.splitlines() if row.startswith("| `")
              for name in re.findall(r"`([A-Z_]+)`", row.split(" | ")[0])}
    missing = sorted(n for n in named - NOT_VARIABLES if n not in tabled)
    assert not missing, f"table these in docs/operations.md (Environment): {missing}"


@pytest.mark.parametrize(("name", "value", "read", "expected"), [
    ("PODIUM_CONTROL_URL", "", env.control_url, env.DEFAULT_CONTROL_URL),
    ("PODIUM_CONTROL_URL", "http://plane:9", env.control_url, "http://plane:9"),
    ("PODIUM_DATABASE_URL", "", env.database_url, None),
    ("PODIUM_CONTROL_KEY", "k", env.control_key, "k"),
], ids=["control-url-unset", "control-url", "database-unset", "control-key"])
def test_env_reads(monkeypatch: pytest.MonkeyPatch, name: str, value: str, read,
                   expected) -> None:
    monkeypatch.setenv(name, value)
    assert read() == expected


def test_the_gateway_keys_are_taken_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.GATEWAY_KEYS, '{"api_keys": ["a"]}')
    assert env.take_gateway_keys() == {"api_keys": ["a"]}
    assert env.take_gateway_keys() == {}
