"""What a burst of constrained requests waits for, on an idle machine: N new specs handed to the
compiler at the same instant from one asyncio loop, as a server's opening burst does, with the
catalog known (the package's `constraint_catalog`), in the worker process and in the server's
threads.

    HF_HUB_OFFLINE=1 python -m bench.constraints_burst [--burst 32] [--repeats 5]

Per compiler: the p50 / max of each request's wait (what `podium:constraint_compile_seconds`
records), and the mean of the compiles' own time (`podium:constraint_compile_work_seconds`).
With no serving load on the loop, a wait well above the own time is the compiler's queue.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.support.catalog import make_titles


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burst", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-candidates", type=int, default=20)
    ap.add_argument("--max-candidates", type=int, default=100)
    opts = ap.parse_args()
    from podium.constraints import ConstraintPrecompiler, validate_constraint
    from podium.constraints.compile.store import FormStore
    from podium.metrics.server import REGISTRY
    from podium.package.defaults import default_model_dir

    rng = random.Random(0)
    catalog = make_titles(50_000)
    model = str(default_model_dir())
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    catalog_file = Path(tempfile.mkdtemp(prefix="podium-burst-", dir=shm)) / "catalog.txt"
    catalog_file.write_text("\n".join(catalog) + "\n")

    def spec() -> dict:
        n = rng.randint(opts.min_candidates, opts.max_candidates)
        return validate_constraint({"type": "distinct_items", "items": rng.sample(catalog, n),
                                    "min": 3, "max": 5})

    def work(name: str) -> tuple[float, float]:
        """(compiles, seconds) the work histogram holds for `name` so far."""
        labels = {"type": "distinct_items", "compiler": name}
        family = "podium:constraint_compile_work_seconds"
        return (REGISTRY.get_sample_value(family + "_count", labels) or 0.0,
                REGISTRY.get_sample_value(family + "_sum", labels) or 0.0)

    async def burst(compiler: ConstraintPrecompiler) -> list[float]:
        specs = [spec() for _ in range(opts.burst)]

        async def timed(s: dict) -> float:
            start = time.perf_counter()
            await compiler.compile(s)
            return time.perf_counter() - start

        return list(await asyncio.gather(*(timed(s) for s in specs)))

    async def run() -> None:
        for name, process in (("process", True), ("thread", False)):
            store = FormStore(Path(tempfile.mkdtemp(prefix="podium-burst-forms-", dir=shm)))
            compiler = ConstraintPrecompiler(model, 49152, store=store, process=process)
            await compiler.prepare(catalog_file, catalog)
            await compiler.compile(spec())  # first-use costs (numba's methods) out of the figures
            for repeat in range(opts.repeats):
                count, total = work(name)
                waits = await burst(compiler)
                count, total = work(name)[0] - count, work(name)[1] - total
                ms = [round(1000 * v, 2) for v in sorted(waits)]
                print(f"{name} burst {repeat}: wait p50 {ms[len(ms) // 2]} ms, max {ms[-1]} ms;"
                      f" {int(count)} compiles, own time mean {1000 * total / count:.2f} ms, "
                      f"sum {1000 * total:.1f} ms", flush=True)
                await asyncio.sleep(0.5)
            compiler.shutdown()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
