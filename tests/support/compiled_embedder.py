"""The shared instance's embedder is a package that runs compiled on this machine: announced
(`podium materialize`, which compiles it) into the session's own compile cache before the
shared instance boots, then booted from that cache by it. tests/package/test_compile_real.py
checks both ends (compiled once at announce, booted without compiling) on these two engine
starts instead of two of its own (tests/README.md, "Real engine starts").

all-MiniLM-L6-v2 (6 layers) is the cheapest model to compile here; a small context keeps the
build short. The cache is a temporary directory: every run compiles cold."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.harness import PODIUM, ROOT

MAX_MODEL_LEN = 128
"""The compiled embedder's context (the model's own is 512): every embedding test's input is
far under it, and the ones over the context stay over it."""


def manifest(version: str = "1", max_model_len: int = MAX_MODEL_LEN) -> dict[str, Any]:
    """The default embedding package, compiled (not the CPU table's `auto`: eager)."""
    from podium.package.defaults import embedding_manifest

    return {**embedding_manifest(), "version": version, "engine_mode": "compiled",
            "engine_args": {"max_model_len": max_model_len}}


@dataclass(frozen=True)
class Announced:
    """The embedder's announce: what `podium materialize` printed and how long it took."""

    package: Path
    cache: Path
    """The session's compile cache (PODIUM_COMPILE_CACHE of the announce and the instance)."""
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def env(self) -> dict[str, str]:
        return {**os.environ, "PODIUM_COMPILE_CACHE": str(self.cache)}


def announce(package: Path, cache: Path) -> Announced:
    """Compile the package as `podium announce` does (materialize). Not asserted here: the
    shared instance boots either way (a miss compiles at boot); the compile test asserts."""
    env = {**os.environ, "PODIUM_COMPILE_CACHE": str(cache)}
    started = time.monotonic()
    done = subprocess.run([*PODIUM, "materialize", str(package)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=900)
    return Announced(package, cache, done.returncode, done.stdout, done.stderr,
                     time.monotonic() - started)
