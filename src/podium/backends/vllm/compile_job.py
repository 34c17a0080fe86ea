"""`python -m podium.backends.vllm.compile_job PACKAGE`: start its engine once, then stop.

Run by `podium.backends.vllm.engine_build.build` at announce with VLLM_CACHE_ROOT on the
compile-cache entry: the engine is built exactly as an instance builds it (same args, same
mode), so what it compiles is what boot will load.
"""

from __future__ import annotations

import logging
import sys
import time


def main(argv: list[str]) -> int:
    from podium import env
    from podium.backends.vllm import engine_build
    from podium.backends.vllm.engine import _start_engine, build_engine_args
    from podium.package.cache import ModelCache
    from podium.package.package import open_package

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    env.force_offline()
    package = open_package(argv[0])
    weights = ModelCache().lookup(package)
    if weights is None:
        print(f"{package.key} is not materialized; run `podium materialize` first",
              file=sys.stderr)
        return 2
    args = build_engine_args(package.manifest, str(weights))  # type: ignore[arg-type]
    engine_build.prepare(package, weights, args)
    threads = engine_build.worker_threads(package)  # bound as at boot: vLLM keys on it
    started = time.monotonic()
    engine = _start_engine(args, threads)
    print(f"engine of {package.key} up in {time.monotonic() - started:.1f} s", flush=True)
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
