"""A python-backend model that answers its own version number, for repository tests."""

from __future__ import annotations

from pathlib import Path

from podium.package.package import write_manifest

MODEL_PY = '''
import time
import numpy as np

class Model:
    def initialize(self, config):
        self.version = float(config["model_version"])
        self.delay = config["parameters"].get("delay_s", 0)

    def execute(self, requests):
        time.sleep(self.delay)
        return [{"version": np.full((len(r["x"]), 1), self.version)} for r in requests]
'''


def write_versioned(directory: Path, name: str, version: str, delay_s: float = 0.0) -> Path:
    """A python package `name@version` whose model answers its own version after `delay_s`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.py").write_text(MODEL_PY)
    write_manifest(directory, {
        "name": name, "version": version, "backend": "python",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "version", "datatype": "FP32", "shape": [1]}],
        "parameters": {"delay_s": delay_s}})
    return directory
