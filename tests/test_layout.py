"""The tests mirror `src/podium/`, and test modules never import each other.

Each directory under `tests/` (except `support/`, the shared helpers) names the package or module
of `src/podium/` it tests, so a failing test points at its code; a helper that two test modules
need lives in `tests.support` (or a fixture in the nearest `conftest.py`), never in a test module.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SOURCES = TESTS.parent / "src" / "podium"
SHARED = "support"  # the one directory that is not a mirror: helpers shared by the tests


def _test_dirs() -> list[Path]:
    """Every directory below `tests/` that holds Python files, outside `support/`."""
    dirs = {path.parent for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts}
    return sorted(d for d in dirs if d != TESTS and d.relative_to(TESTS).parts[0] != SHARED)


def _imported_files(path: Path) -> set[Path]:
    """The files under `tests/` that `path` imports (relative imports resolved)."""
    package = ["tests", *path.relative_to(TESTS).parts[:-1]]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            # `from . import x` may name a submodule: try each imported name as one too
            names.append(module)
            names.extend(f"{module}.{alias.name}" for alias in node.names)
    files = set()
    for name in names:
        parts = name.split(".")
        if parts[0] == "tests" and len(parts) > 1:
            candidate = TESTS.joinpath(*parts[1:]).with_suffix(".py")
            if candidate.is_file():
                files.add(candidate)
    return files


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _shown(path: Path) -> str:
    return f"tests/{path.relative_to(TESTS)}"


def test_every_test_directory_names_a_package_or_module_of_podium() -> None:
    strays = []
    for directory in _test_dirs():
        mirrored = SOURCES.joinpath(*directory.relative_to(TESTS).parts)
        if not (mirrored.is_dir() or mirrored.with_suffix(".py").is_file()):
            strays.append(f"tests/{directory.relative_to(TESTS)}")
    assert not strays, (
        f"{strays} mirror nothing in src/podium/: move their tests to the directory of the "
        "package they test (shared helpers go to tests/support/)")


def test_no_test_module_imports_another_test_module() -> None:
    offenders = []
    for path in _test_files():
        bad = sorted(_shown(f) for f in _imported_files(path) if f.name.startswith("test_"))
        if bad:
            offenders.append(f"{_shown(path)} imports {', '.join(bad)}")
    assert not offenders, (
        "test modules import each other; move the shared code to tests/support/ "
        "(or a fixture to conftest.py):\n" + "\n".join(offenders))


def test_helpers_live_in_support_or_conftest() -> None:
    # A helper module beside the tests (not test_*, not conftest) is shared code in disguise.
    def shared(path: Path) -> bool:
        return path.relative_to(TESTS).parts[0] == SHARED or path.name == "conftest.py"

    loose = [_shown(p) for p in _test_files()
             if not shared(p) and not p.name.startswith("test_") and p.name != "__init__.py"]
    assert not loose, f"{loose}: helpers belong in tests/support/ (one module per concept)"
    imports = [f"{_shown(p)} imports {_shown(f)}" for p in _test_files()
               for f in sorted(_imported_files(p)) if not shared(f) and f.name != "__init__.py"]
    assert not imports, "imports from tests must point into tests.support or a conftest:\n" + (
        "\n".join(imports))
