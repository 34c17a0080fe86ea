"""Loading a Triton Python model's `model.py`: `triton_python_backend_utils` importable under
that name, the model's folder on `sys.path` for its own imports, the file loaded by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from podium.errors import PackageError

UTILS_NAME = "triton_python_backend_utils"


def install_utils() -> Any:
    """Podium's `pb_utils`, registered under Triton's module name."""
    from podium.triton import pb_utils

    sys.modules.setdefault(UTILS_NAME, pb_utils)
    return pb_utils


def load_model_class(path: Path, module_name: str) -> type:
    """`TritonPythonModel` from the file at `path`."""
    install_utils()
    if not path.is_file():
        raise PackageError(f"{path}: no such model file (set default_model_filename in "
                           "config.pbtxt, or add the file)", param="default_model_filename")
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PackageError(f"{path}: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise PackageError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise PackageError(f"{path}: defines no class TritonPythonModel")
    return cls
